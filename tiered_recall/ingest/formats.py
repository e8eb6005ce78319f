"""Conversation formats -> Turns: JSONL of messages, OpenAI chat, ShareGPT, LoCoMo, the ChatGPT and Claude exports
(exports.py); plus auto-detection.

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
    chatgpt   ChatGPT's data export ({"mapping": {...}, "current_node": ...} per conversation); claude: Claude's
              ({"chat_messages": [...], "uuid": ...}); exports.py says how they are read.
Field names can be remapped (FieldMap); dotted names reach into nested objects ("author.role"). With a turns
field (FieldMap.turns, --turns-field) every record is one conversation whose turns are the list at that field, in
any of the formats' turn shapes ({"dialogue": [{"speaker", "utterance", "time"}]} with --turns-field dialogue
--role-field speaker --text-field utterance --time-field time). A jsonl record may carry its memory's own
"memory_id", "namespace" and "metadata" (what `tiered-recall export` writes, so that an export ingests back to the
same memories); a plain "id" field is a chat log's own and names no memory. System messages (role "system") are
skipped unless keep_system is set.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidInput
from .exports import SkippedParts, looks_like_chatgpt, looks_like_claude, read_chatgpt, read_claude
from .records import BadRecord, Record
from .sources import Source
from .turns import Turn
from .values import (
    TEXT_FIELDS, FieldMap, ReadState, RecordProblem, SkippedTurn, check_text, describe, first, lookup, parse_time,
    present, scalar_text, stem,
)

FORMATS = ("jsonl", "openai", "sharegpt", "locomo", "chatgpt", "claude", "conversation")
FORMAT_CHOICES = ("auto", *FORMATS)

CONVERSATION_ID_FIELDS = ("id", "conversation_id", "session_id", "thread_id")
_SESSION_KEY = re.compile(r"^session_(\d+)$")


def detect_format(value: Any, *, fields: FieldMap) -> str | None:
    """The format a first record belongs to, or None when it fits none."""
    if fields.turns is not None:
        return "conversation"
    if isinstance(value, dict):
        if looks_like_chatgpt(value):
            return "chatgpt"
        if looks_like_claude(value):
            return "claude"
        if isinstance(value.get("conversation"), dict) and ("sample_id" in value or "qa" in value):
            return "locomo"
        if isinstance(value.get("conversations"), list):
            return "sharegpt"
        if isinstance(value.get("messages"), list):
            return "openai"
        if present(value, fields.candidates("text")):
            return "jsonl"
    if isinstance(value, list) and value and isinstance(value[0], dict) and detect_format(value[0], fields=fields) == "jsonl":
        return "openai"  # one conversation per line, written as a list of messages
    return None


def _text_of(value: Any, field_name: str, fields: FieldMap) -> str:
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
                                f"conversation's turns, name that list with {fields.given('turns_field', field_name)} "
                                f"and their text field with {fields.to_fill('text_field', 'FIELD')}")
        pieces = []
        for part in value:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                pieces.append(part["text"])  # {"type": "text", "text": ...}; images etc. carry no text
        return "\n".join(piece for piece in pieces if piece)
    raise RecordProblem(f"field {field_name!r} must be a string or a list of content parts, got {describe(value)}")


def _message_turn(
    message: Any, *, source: Source, line: int, key: str, position: int, fields: FieldMap,
    session: str | None, what: str, conversation: str,
) -> Turn | SkippedTurn:
    if not isinstance(message, dict):
        raise RecordProblem(f"{what} must be an object with role and text fields, got {describe(message)}")
    text_name, raw_text = first(message, fields.candidates("text"))
    if not present(message, fields.candidates("text")):
        wanted = fields.text or "/".join(TEXT_FIELDS)
        raise RecordProblem(f"{what} has no text field ({wanted}), it is {describe(message)}; map it with "
                            f"{fields.to_fill('text_field', 'FIELD')}")
    text = check_text(_text_of(raw_text, text_name or "content", fields)).strip()
    if not text:
        return SkippedTurn("no text (empty content, e.g. a tool call)")
    role_name, raw_role = first(message, fields.candidates("role"))
    if isinstance(raw_role, dict):  # ChatGPT exports: "author": {"role": "user", ...}
        raw_role = raw_role.get("role") or raw_role.get("name")
    role = scalar_text(raw_role, role_name or "role")
    if role is not None and role.lower() == "system" and not fields.keep_system:
        return fields.skipped_unless_kept("system message")
    time_name, raw_time = first(message, fields.candidates("time"))
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
    session_name, raw_session = first(value, fields.candidates("session"))
    session = scalar_text(raw_session, session_name or "session")
    key = source.name if session is None else f"{source.name}#session={session}"
    # The position is taken before the rest is checked, so a bad line that is fixed later gets the
    # id it would have had, and the turns after it keep theirs.
    position = state.next_position.get(key, 0)
    state.next_position[key] = position + 1
    if not present(value, fields.candidates("text")):
        wanted = fields.text or "/".join(TEXT_FIELDS)
        raise RecordProblem(
            f"expected a message with a text field ({wanted}), got {describe(value)}; "
            f"map the field with {fields.to_fill('text_field', 'FIELD')}"
        )
    turn = _message_turn(value, source=source, line=line, key=key, position=position, fields=fields, session=session,
                         what="the message", conversation=session or stem(source))
    yield _own_fields(value, turn) if isinstance(turn, Turn) else turn


def _conversation_key(value: dict[str, Any], *, source: Source, line: int, ordinal: int, state: ReadState) -> str | None:
    """The record's own id, else (source, record number); None when this id was already read in this run."""
    _, raw_id = first(value, CONVERSATION_ID_FIELDS)
    key = f"{source.name}#{ordinal}" if raw_id is None else scalar_text(raw_id, "id")
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
    if not isinstance(value, dict) or not isinstance(lookup(value, list_field), list):
        raise RecordProblem(f"expected an object with a {list_field!r} list, got {describe(value)}"
                            + (f"; name the list of turns with {fields.to_fill('turns_field', 'FIELD')}"
                               if isinstance(value, dict) else ""))
    messages = lookup(value, list_field)
    if not messages:
        raise RecordProblem(f"the conversation's {list_field!r} list is empty: it has no turns to store")
    key = _conversation_key(value, source=source, line=line, ordinal=ordinal, state=state)
    if key is None:
        first_read = state.seen_conversations.get(scalar_text(first(value, CONVERSATION_ID_FIELDS)[1], "id") or "", "?")
        for _ in messages:
            yield SkippedTurn(f"conversation id repeated (first read at {first_read})")
        return
    raw_name = first(value, CONVERSATION_ID_FIELDS)[1]
    name = scalar_text(raw_name, "id") if raw_name is not None else f"{stem(source)}-{ordinal}"
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
    sample_id = scalar_text(value.get("sample_id"), "sample_id")
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
            text = check_text(raw["text"]).strip()
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
                role=scalar_text(raw.get("speaker"), "speaker"), session=name, created_at=created_at,
                date_text=date_text if isinstance(date_text, str) else None, metadata=metadata, conversation=sample_id,
            )


def read_turns(
    records: Iterator[Record | BadRecord], *, source: Source, format: str, fields: FieldMap, state: ReadState,
) -> Iterator[Turn | SkippedTurn | SkippedParts | BadRecord]:
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
                    f"({describe(item.value)}); name the format with {fields.to_fill('format', 'FORMAT')} (one of "
                    f"{', '.join(FORMATS)}), or map the text field with {fields.to_fill('text_field', 'FIELD')}"
                )
            state.last_format = chosen
        try:
            # A record's turns are collected before any is yielded: a bad record contributes nothing.
            if chosen == "locomo":
                produced = list(_read_locomo(item.value, source=source, line=item.line, state=state))
            elif chosen in ("chatgpt", "claude"):
                read = read_chatgpt if chosen == "chatgpt" else read_claude
                produced = list(read(item.value, source=source, line=item.line, ordinal=ordinal, fields=fields,
                                     state=state))
            elif chosen == "jsonl" or (chosen == "openai" and isinstance(item.value, dict) and "messages" not in item.value):
                # An OpenAI file may also be a plain list of messages: that is the jsonl shape.
                produced = list(_read_message(item.value, source=source, line=item.line, fields=fields, state=state))
            elif chosen in ("openai", "sharegpt", "conversation"):
                list_field = {"openai": "messages", "sharegpt": "conversations"}.get(chosen, fields.turns)
                if list_field is None:
                    raise InvalidInput(f"{fields.given('format', 'conversation')} needs the field holding each record's list of turns: "
                                       f"{fields.to_fill('turns_field', 'FIELD')}")
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
