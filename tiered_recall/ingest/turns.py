"""The Turn record read from any format, its deterministic memory id and its content hash."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# Ids live in a signed 64-bit column (LanceDB, the hot tier): keep them positive and non-zero.
ID_MASK = (1 << 63) - 1
_FIELD_SEPARATOR = "\x1f"  # cannot occur in a namespace or a key a user would type


@dataclass(slots=True)
class Turn:
    """One utterance of a conversation, as read from a file, before it becomes a memory.

    conversation_key: identifies the conversation across runs (an id the data carries, else the
        source's name and the record's ordinal); with `position` it fixes the memory id.
    conversation: the conversation's name as a user would write it ({conversation} in a namespace or template).
    position: the turn's place in its conversation ("3", or the data's own id such as "D1:3").
    text: what is stored (image captions already appended).
    date_text: the date as the data wrote it (LoCoMo session dates), for templates.
    """

    source: str
    line: int
    conversation_key: str
    position: str
    text: str
    role: str | None = None
    session: str | None = None
    created_at: datetime | None = None
    date_text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    conversation: str = ""  # the conversation's own name, for {conversation}: its id, session, or the file's stem
    namespace: str | None = None  # a record's own namespace (what `tiered-recall export` writes)
    # An exported memory's id (likewise): the record is that memory, stored with its own id, its text embedded alone
    # (as TieredMemory.add embeds it) and its metadata exactly as given.
    memory_id: int | None = None

    @property
    def speaker(self) -> str:
        """The name a template writes before the text: the speaker/role, capitalised as given."""
        return self.role or "Someone"

    @property
    def display_date(self) -> str | None:
        """The date a template shows: date_text as the data wrote it, else created_at formatted, else None."""
        if self.date_text:
            return self.date_text
        if self.created_at is not None:
            return self.created_at.strftime("%d %B %Y, %H:%M")
        return None


def turn_id(*, namespace: str, conversation_key: str, position: str) -> int:
    """63-bit positive id from (namespace, conversation, position): re-reading the same turn gives the same id."""
    payload = _FIELD_SEPARATOR.join((namespace, conversation_key, position)).encode("utf-8", "surrogatepass")
    value = int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little") & ID_MASK
    return value or 1


def content_hash(turn: Turn, *, embedded_text: str, embedder_name: str) -> str:
    """Hash of everything that ends up in the memory: a changed value means the stored copy is stale.

    The embedded text and embedder name are included so a new template or embedder re-embeds.
    """
    created = turn.created_at.isoformat() if turn.created_at else None
    payload = json.dumps(
        [turn.text, turn.role, turn.session, created, turn.metadata, embedded_text, embedder_name],
        sort_keys=True, ensure_ascii=False, default=str,
    )
    return hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def as_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC so every stored time is comparable."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
