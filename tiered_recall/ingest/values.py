"""What every format reader shares: the reading options (FieldMap), what is remembered across records (ReadState),
the problem a reader raises for a malformed record, and the lookup of fields, texts, names and times in JSON values."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..spelling import option_set, option_to_fill
from .sources import Source
from .turns import as_utc

ROLE_FIELDS = ("role", "from", "speaker", "author", "sender")
TEXT_FIELDS = ("content", "value", "text", "message", "body")
SESSION_FIELDS = ("session", "session_id", "conversation_id", "thread_id", "chat_id")
TIME_FIELDS = ("timestamp", "created_at", "create_time", "time", "date", "datetime")
LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"
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
    keep_system: bool = False  # store system and tool messages too
    # How messages name ingest's options: the Python keyword unless named here (the CLI names its flags).
    option_names: Mapping[str, str] = field(default_factory=dict)

    def option(self, name: str) -> str:
        """Option `name` as the caller spells it ("text_field", or "--text-field" on the command line)."""
        return self.option_names.get(name, name)

    def given(self, name: str, value: Any) -> str:
        """Option `name` set to value as the caller writes it: turns_field='dialogue' / --turns-field dialogue."""
        return option_set(self.option(name), value)

    def to_fill(self, name: str, placeholder: str) -> str:
        """Option `name` with its value left to fill in: text_field=... / --text-field FIELD."""
        return option_to_fill(self.option(name), placeholder)

    def skipped_unless_kept(self, what: str) -> SkippedTurn:
        """A system (or tool) message skipped: the reason names the option that stores them."""
        return SkippedTurn(f"{what} ({self.given('keep_system', True)} stores them)")

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


def lookup(record: dict[str, Any], name: str) -> Any:
    """The value of field `name` (dotted names reach into nested objects: "author.role"), None when absent."""
    if name in record:
        return record[name]
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def present(record: dict[str, Any], names: tuple[str, ...]) -> bool:
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


def first(record: dict[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
    """(name, value) of the first of the fields that holds a value (not null), else (None, None)."""
    for name in names:
        value = lookup(record, name)
        if value is not None:
            return name, value
    return None, None


def describe(value: Any) -> str:
    """A short description of a JSON value for an error message ("an object with keys [...]", "a JSON array")."""
    if isinstance(value, dict):
        keys = sorted(map(str, value))
        shown = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
        return f"an object with keys [{shown}]"
    return f"a JSON {type(value).__name__}".replace("dict", "object").replace("list", "array").replace("str", "string")


def check_text(text: str) -> str:
    """The text, when it can be stored (UTF-8: no lone surrogate); else a RecordProblem that says so."""
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


def scalar_text(value: Any, field_name: str) -> str | None:
    """A string or integer field as text (None stays None); anything else is a RecordProblem naming the field."""
    if value is None:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    raise RecordProblem(f"field {field_name!r} must be a string or an integer, got {describe(value)}")


def stem(source: Source) -> str:
    """A source's name without its folders and suffixes ("logs/chat.jsonl.gz" -> "chat")."""
    name = source.name.rsplit("/", 1)[-1]
    for suffix in (".gz", ".jsonl", ".ndjson", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or source.name


