"""Conversation formats -> Turns: JSONL of messages, OpenAI chat, ShareGPT, LoCoMo; plus auto-detection.

Formats and the conversation key each turn's id is derived from:
    jsonl     one message per record ({"role", "content"} + optional session / timestamp); the
              conversation is (source name, session); positions count within the source.
    openai    {"messages": [...]} per record (one conversation per line or per file), or a file that
              is a list of messages (treated as jsonl); key: the record's "id" / "conversation_id",
              else (source name, record number).
    sharegpt  {"conversations": [{"from", "value"}, ...]} per record; key as for openai.
    locomo    the LoCoMo benchmark file: key sample_id, position dia_id; session dates become
              created_at; dia_id, conversation and session date are kept in metadata; image
              captions (blip_caption) are appended to the text.
Field names can be remapped (FieldMap); dotted names reach into nested objects ("author.role"). With a turns
field (FieldMap.turns, --turns-field) every record is one conversation whose turns are the list at that field, in
any of the formats' turn shapes ({"dialogue": [{"speaker", "utterance", "time"}]} with --turns-field dialogue
--role-field speaker --text-field utterance --time-field time). A jsonl record may carry its memory's own
"memory_id", "namespace" and "metadata" (what `tiered-recall export` writes, so that an export ingests back to the
same memories); a plain "id" field is a chat log's own and names no memory. System messages (role "system") are skipped unless keep_system is set.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidInput
from .records import BadRecord, Record
from .sources import Source
from .turns import Turn, as_utc

FORMATS = ("jsonl", "openai", "sharegpt", "locomo", "conversation")
FORMAT_CHOICES = ("auto", *FORMATS)

ROLE_FIELDS = ("role", "from", "speaker", "author", "sender")
TEXT_FIELDS = ("content", "value", "text", "message", "body")
SESSION_FIELDS = ("session", "session_id", "conversation_id", "thread_id", "chat_id")
TIME_FIELDS = ("timestamp", "created_at", "create_time", "time", "date", "datetime")
CONVERSATION_ID_FIELDS = ("id", "conversation_id", "session_id", "thread_id")
LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"
_SESSION_KEY = re.compile(r"^session_(\d+)$")
# ms since the epoch is what JavaScript exports write; seconds would not reach this until year 5138.
_EPOCH_MILLISECONDS_FROM = 1e11


@dataclass(frozen=True, slots=True)
class SkippedTurn:
    """A well-formed record that yields no memory (e.g. a tool call without text)."""

    reason: str


@dataclass(frozen=True, slots=True)
class FieldMap:
    """Which fields hold role, text, session and time; None means try the usual names in order."""

    role: str | None = None
    text: str | None = None
    session: str | None = None
    time: str | None = None
    turns: str | None = None  # the list of a conversation's turns (the "conversation" format)
    keep_system: bool = False  # store system messages too

    def candidates(self, kind: str) -> tuple[str, ...]:
        """The field names to try for kind ("role", "text", "session" or "time"): the one given, else the usual ones."""
        chosen = getattr(self, kind)
        if chosen is not None:
            return (chosen,)
        return {"role": ROLE_FIELDS, "text": TEXT_FIELDS, "session": SESSION_FIELDS, "time": TIME_FIELDS}[kind]


class RecordProblem(Exception):
    """Raised inside a reader for a malformed record; becomes a BadRecord with file:line."""


@dataclass(slots=True)
class ReadState:
    """What readers remember across records of one run: bounded by the number of conversations."""

    next_position: dict[str, int] = field(default_factory=dict)
    seen_conversations: dict[str, str] = field(default_factory=dict)  # key -> "file:line" first seen
    last_format: str | None = None  # the format of the source read last (detected or given)


def _lookup(record: dict[str, Any], name: str) -> Any:
    if name in record:
        return record[name]
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _present(record: dict[str, Any], names: tuple[str, ...]) -> bool:
    """Whether any of the fields exists (even as null: a message with "content": null is a message)."""
    for name in names:
        if name in record:
            return True
        value: Any = record
        for part in name.split("."):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            return True
    return False


def _first(record: dict[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
    for name in names:
        value = _lookup(record, name)
        if value is not None:
            return name, value
    return None, None


def detect_format(value: Any, *, fields: FieldMap) -> str | None:
    """The format a first record belongs to, or None when it fits none."""
    if fields.turns is not None:
        return "conversation"
    if isinstance(value, dict):
        if isinstance(value.get("conversation"), dict) and ("sample_id" in value or "qa" in value):
            return "locomo"
        if isinstance(value.get("conversations"), list):
            return "sharegpt"
        if isinstance(value.get("messages"), list):
            return "openai"
        if _present(value, fields.candidates("text")):
            return "jsonl"
    if isinstance(value, list) and value and isinstance(value[0], dict) and detect_format(value[0], fields=fields) == "jsonl":
        return "openai"  # one conversation per line, written as a list of messages
    return None


def describe(value: Any) -> str:
    """A short description of a JSON value for an error message ("an object with keys [...]", "a JSON array")."""
    if isinstance(value, dict):
        keys = sorted(map(str, value))
        shown = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
        return f"an object with keys [{shown}]"
    return f"a JSON {type(value).__name__}".replace("dict", "object").replace("list", "array").replace("str", "string")


def _text_of(value: Any, field_name: str) -> str:
    """Message content as text: a string, OpenAI content parts, or a ChatGPT-export {"parts": [...]}."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("parts"), list):
        value = value["parts"]
    if isinstance(value, list):
        if value and all(isinstance(part, dict) and part.get("type") in (None, "") and "text" not in part
                         for part in value):
            raise RecordProblem(f"field {field_name!r} holds a list of objects, not text: if they are a "
                                f"conversation's turns, name that list with turns_field={field_name!r} "
                                f"(--turns-field {field_name}) and their text field with text_field=... (--text-field)")
        pieces = []
        for part in value:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                pieces.append(part["text"])  # {"type": "text", "text": ...}; images etc. carry no text
        return "\n".join(piece for piece in pieces if piece)
    raise RecordProblem(f"field {field_name!r} must be a string or a list of content parts, got {describe(value)}")


def _check_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RecordProblem("the text holds a lone surrogate (an unpaired \\ud800-\\udfff escape); fix the source") from None
    return text


def parse_time(value: Any, *, field_name: str) -> datetime | None:
    """ISO 8601 text, epoch seconds (or milliseconds), or LoCoMo's "1:56 pm on 8 May, 2023" -> UTC datetime."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise RecordProblem(f"field {field_name!r} is a boolean, expected a time")
    if isinstance(value, (int, float)):
        seconds = value / 1000 if value >= _EPOCH_MILLISECONDS_FROM else value
        try:
            return datetime.fromtimestamp(seconds, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise RecordProblem(f"field {field_name!r} = {value!r} is out of range for epoch seconds") from None
    if isinstance(value, str):
        text = value.strip()
        iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
        try:
            return as_utc(datetime.fromisoformat(iso))
        except ValueError:
            pass
        try:
            return as_utc(datetime.strptime(text, LOCOMO_DATE_FORMAT))
        except ValueError:
            pass
    raise RecordProblem(
        f"field {field_name!r} = {value!r} is not a time; use ISO 8601 (2024-05-01T12:00:00Z) or epoch seconds"
    )


def _scalar_text(value: Any, field_name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    raise RecordProblem(f"field {field_name!r} must be a string or an integer, got {describe(value)}")


def _message_turn(
    message: Any, *, source: Source, line: int, key: str, position: int, fields: FieldMap,
    session: str | None, what: str, conversation: str,
) -> Turn | SkippedTurn:
    if not isinstance(message, dict):
        raise RecordProblem(f"{what} must be an object with role and text fields, got {describe(message)}")
    text_name, raw_text = _first(message, fields.candidates("text"))
    if not _present(message, fields.candidates("text")):
        wanted = fields.text or "/".join(TEXT_FIELDS)
        raise RecordProblem(f"{what} has no text field ({wanted}), it is {describe(message)}; map it with text_field=...")
    text = _check_text(_text_of(raw_text, text_name or "content")).strip()
    if not text:
        return SkippedTurn("no text (empty content, e.g. a tool call)")
    role_name, raw_role = _first(message, fields.candidates("role"))
    if isinstance(raw_role, dict):  # ChatGPT exports: "author": {"role": "user", ...}
        raw_role = raw_role.get("role") or raw_role.get("name")
    role = _scalar_text(raw_role, role_name or "role")
    if role is not None and role.lower() == "system" and not fields.keep_system:
        return SkippedTurn("system message (keep_system=True, --keep-system, stores them)")
    time_name, raw_time = _first(message, fields.candidates("time"))
    created_at = parse_time(raw_time, field_name=time_name or "time")
    metadata = {"source": source.name}
    return Turn(
        source=source.display, line=line, conversation_key=key, position=str(position), text=text,
        role=role, session=session, created_at=created_at, metadata=metadata, conversation=conversation,
    )


def _own_fields(value: dict[str, Any], turn: Turn) -> Turn:
    """A jsonl record's own namespace and metadata, and for an exported memory (`tiered-recall export` writes a
    memory_id) that memory's id and exactly its metadata."""
    raw_id = value.get("memory_id")
    if raw_id is not None:
        if isinstance(raw_id, bool) or not isinstance(raw_id, (int, str)) or not str(raw_id).isdigit() \
                or not 0 < int(raw_id) < 1 << 63:
            raise RecordProblem(f"field 'memory_id' must be a memory id (an integer 1 .. 2**63 - 1, or its digits as "
                                f"a string), got {raw_id!r}")
        turn.memory_id = int(raw_id)
    raw_ns = value.get("namespace")
    if raw_ns is not None:
        if not isinstance(raw_ns, str) or not raw_ns:
            raise RecordProblem(f"field 'namespace' must be a non-empty string, got {describe(raw_ns)}")
        turn.namespace = raw_ns
    raw_meta = value.get("metadata")
    if raw_meta is not None and not isinstance(raw_meta, dict):
        raise RecordProblem(f"field 'metadata' must be an object, got {describe(raw_meta)}")
    if turn.memory_id is not None:
        turn.metadata = dict(raw_meta or {})  # the memory as it was: no provenance of this reading added
    elif raw_meta:
        turn.metadata = {**raw_meta, **turn.metadata}
    return turn


def _read_message(value: Any, *, source: Source, line: int, fields: FieldMap, state: ReadState) -> Iterator[Turn | SkippedTurn]:
    if not isinstance(value, dict):
        raise RecordProblem(f"expected a message object such as {{\"role\": ..., \"content\": ...}}, got {describe(value)}")
    session_name, raw_session = _first(value, fields.candidates("session"))
    session = _scalar_text(raw_session, session_name or "session")
    key = source.name if session is None else f"{source.name}#session={session}"
    # The position is taken before the rest is checked, so a bad line that is fixed later gets the
    # id it would have had, and the turns after it keep theirs.
    position = state.next_position.get(key, 0)
    state.next_position[key] = position + 1
    if not _present(value, fields.candidates("text")):
        wanted = fields.text or "/".join(TEXT_FIELDS)
        raise RecordProblem(
            f"expected a message with a text field ({wanted}), got {describe(value)}; "
            "map the field with text_field=... (--text-field)"
        )
    turn = _message_turn(value, source=source, line=line, key=key, position=position, fields=fields, session=session,
                         what="the message", conversation=session or _stem(source))
    yield _own_fields(value, turn) if isinstance(turn, Turn) else turn


def _stem(source: Source) -> str:
    """A source's name without its folders and suffixes ("logs/chat.jsonl.gz" -> "chat")."""
    name = source.name.rsplit("/", 1)[-1]
    for suffix in (".gz", ".jsonl", ".ndjson", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or source.name


def _conversation_key(value: dict[str, Any], *, source: Source, line: int, ordinal: int, state: ReadState) -> str | None:
    """The record's own id, else (source, record number); None when this id was already read in this run."""
    _, raw_id = _first(value, CONVERSATION_ID_FIELDS)
    key = f"{source.name}#{ordinal}" if raw_id is None else _scalar_text(raw_id, "id")
    assert key is not None
    where = f"{source.display}:{line}"
    if key in state.seen_conversations:
        return None
    state.seen_conversations[key] = where
    return key


def _read_conversation(
    value: Any, *, list_field: str, source: Source, line: int, ordinal: int, fields: FieldMap, state: ReadState,
) -> Iterator[Turn | SkippedTurn]:
    if isinstance(value, list):  # a bare list of messages is one conversation
        value = {list_field: value}
    if not isinstance(value, dict) or not isinstance(_lookup(value, list_field), list):
        raise RecordProblem(f"expected an object with a {list_field!r} list, got {describe(value)}"
                            + ("; name the list of turns with turns_field=... (--turns-field)"
                               if isinstance(value, dict) else ""))
    messages = _lookup(value, list_field)
    if not messages:
        raise RecordProblem(f"the conversation's {list_field!r} list is empty: it has no turns to store")
    key = _conversation_key(value, source=source, line=line, ordinal=ordinal, state=state)
    if key is None:
        first = state.seen_conversations.get(_scalar_text(_first(value, CONVERSATION_ID_FIELDS)[1], "id") or "", "?")
        for _ in messages:
            yield SkippedTurn(f"conversation id repeated (first read at {first})")
        return
    raw_name = _first(value, CONVERSATION_ID_FIELDS)[1]
    name = _scalar_text(raw_name, "id") if raw_name is not None else f"{_stem(source)}-{ordinal}"
    for position, message in enumerate(messages):
        try:
            yield _message_turn(
                message, source=source, line=line, key=key, position=position, fields=fields, session=key,
                what=f"{list_field}[{position}]", conversation=name or key,
            )
        except RecordProblem as problem:
            raise RecordProblem(f"{list_field}[{position}]: {problem}") from None


def _read_locomo(value: Any, *, source: Source, line: int, state: ReadState) -> Iterator[Turn | SkippedTurn]:
    if not isinstance(value, dict) or not isinstance(value.get("conversation"), dict):
        raise RecordProblem(f"expected a LoCoMo sample with a 'conversation' object, got {describe(value)}")
    sample_id = _scalar_text(value.get("sample_id"), "sample_id")
    if not sample_id:
        raise RecordProblem("the LoCoMo sample has no 'sample_id'")
    if sample_id in state.seen_conversations:
        for _ in range(sum(len(v) for k, v in value["conversation"].items() if _SESSION_KEY.match(k) and isinstance(v, list))):
            yield SkippedTurn(f"conversation id repeated (first read at {state.seen_conversations[sample_id]})")
        return
    state.seen_conversations[sample_id] = f"{source.display}:{line}"
    conversation = value["conversation"]
    # Some samples carry more session_N_date_time keys than sessions: iterate over the session lists.
    sessions = sorted(
        (int(match.group(1)), name)
        for name in conversation
        if (match := _SESSION_KEY.match(name)) and isinstance(conversation[name], list)
    )
    for number, name in sessions:
        date_text = conversation.get(f"{name}_date_time")
        created_at = parse_time(date_text, field_name=f"{name}_date_time") if isinstance(date_text, str) else None
        for index, raw in enumerate(conversation[name]):
            where = f"{name}[{index}]"
            if not isinstance(raw, dict) or not isinstance(raw.get("text"), str) or not isinstance(raw.get("dia_id"), str):
                raise RecordProblem(f"{sample_id} {where}: expected {{speaker, dia_id, text}}, got {describe(raw)}")
            text = _check_text(raw["text"]).strip()
            caption = raw.get("blip_caption")
            metadata: dict[str, Any] = {
                "source": source.name, "conversation": sample_id, "dia_id": raw["dia_id"], "session_number": number,
            }
            if date_text:
                metadata["session_date"] = date_text
            if isinstance(caption, str) and caption.strip():
                metadata["image_caption"] = caption.strip()
                # The authors' own form for shared images; keeps the caption searchable with the turn.
                text = f"{text} [shares {caption.strip()}]" if text else f"[shares {caption.strip()}]"
            if not text:
                yield SkippedTurn("no text")
                continue
            yield Turn(
                source=source.display, line=line, conversation_key=sample_id, position=raw["dia_id"], text=text,
                role=_scalar_text(raw.get("speaker"), "speaker"), session=name, created_at=created_at,
                date_text=date_text if isinstance(date_text, str) else None, metadata=metadata, conversation=sample_id,
            )


def read_turns(
    records: Iterator[Record | BadRecord], *, source: Source, format: str, fields: FieldMap, state: ReadState,
) -> Iterator[Turn | SkippedTurn | BadRecord]:
    """Turn a stream of records into turns; the format is detected from the first record when "auto"."""
    chosen = None if format == "auto" else format
    state.last_format = chosen
    ordinal = 0
    for item in records:
        if isinstance(item, BadRecord):
            yield item
            continue
        ordinal += 1
        if chosen is None:
            chosen = detect_format(item.value, fields=fields)
            if chosen is None:
                raise InvalidInput(
                    f"{source.display}:{item.line}: cannot tell the format from the first record "
                    f"({describe(item.value)}); pass format= one of {FORMATS} (--format), or map the text "
                    "field with text_field=... (--text-field)"
                )
            state.last_format = chosen
        try:
            # A record's turns are collected before any is yielded: a bad record contributes nothing.
            if chosen == "locomo":
                produced = list(_read_locomo(item.value, source=source, line=item.line, state=state))
            elif chosen == "jsonl" or (chosen == "openai" and isinstance(item.value, dict) and "messages" not in item.value):
                # An OpenAI file may also be a plain list of messages: that is the jsonl shape.
                produced = list(_read_message(item.value, source=source, line=item.line, fields=fields, state=state))
            elif chosen in ("openai", "sharegpt", "conversation"):
                list_field = {"openai": "messages", "sharegpt": "conversations"}.get(chosen, fields.turns)
                if list_field is None:
                    raise InvalidInput("format 'conversation' needs the field holding each record's list of turns: "
                                       "turns_field=... (--turns-field)")
                produced = list(_read_conversation(
                    item.value, list_field=list_field, source=source, line=item.line, ordinal=ordinal,
                    fields=fields, state=state,
                ))
            else:
                raise InvalidInput(f"unknown format {chosen!r}; use one of {FORMAT_CHOICES}")
        except RecordProblem as problem:
            yield BadRecord(item.line, f"{chosen} record: {problem}")
            continue
        yield from produced
