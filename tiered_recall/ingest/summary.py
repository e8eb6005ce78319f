"""IngestSummary: what one ingest run did, printable as a table line or JSON."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

MAX_BAD_EXAMPLES = 20


@dataclass(slots=True)
class IngestSummary:
    """Counts for one run. added + updated + unchanged = turns stored or confirmed; skipped = read, not stored;
    skipped_parts: parts of messages (stored or not) left out because they are not text.

    bad_records: records that could not be read (only non-zero with skip_bad=True); the first
    MAX_BAD_EXAMPLES are listed as "file:line: problem".
    """

    files: int = 0
    formats: Counter[str] = field(default_factory=Counter)
    conversations: int = 0
    turns_read: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    # parts of messages left out because they are not text (an image, a file, a tool call), per kind
    skipped_parts: Counter[str] = field(default_factory=Counter)
    bad_records: int = 0
    bad_examples: list[str] = field(default_factory=list)
    embedded: int = 0
    batches: int = 0
    elapsed_s: float = 0.0

    @property
    def skipped_total(self) -> int:
        """Turns skipped, over every reason."""
        return sum(self.skipped.values())

    @property
    def turns_per_second(self) -> float:
        """Turns read per second of the run (0 before any time has passed)."""
        return self.turns_read / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def note_bad(self, where: str, message: str) -> None:
        """Counts one bad record; the first MAX_BAD_EXAMPLES are kept as "where: message"."""
        self.bad_records += 1
        if len(self.bad_examples) < MAX_BAD_EXAMPLES:
            self.bad_examples.append(f"{where}: {message}")

    def to_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict (skipped as a total, with skipped_reasons per reason)."""
        return {
            "files": self.files,
            "formats": dict(self.formats),
            "conversations": self.conversations,
            "turns_read": self.turns_read,
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "skipped": self.skipped_total,
            "skipped_reasons": dict(self.skipped),
            "skipped_parts": dict(self.skipped_parts),
            "bad_records": self.bad_records,
            "bad_examples": list(self.bad_examples),
            "embedded": self.embedded,
            "batches": self.batches,
            "elapsed_s": round(self.elapsed_s, 3),
            "turns_per_s": round(self.turns_per_second, 1),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """to_dict() as JSON text."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def __str__(self) -> str:
        text = (
            f"{self.files} file(s), {self.conversations} conversation(s), {self.turns_read} turn(s) read: "
            f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged, "
            f"{self.skipped_total} skipped, {self.bad_records} bad record(s) in {self.elapsed_s:.2f} s "
            f"({self.turns_per_second:,.0f} turns/s)"
        )
        if self.skipped:
            text += "\n  skipped: " + "; ".join(f"{count} {reason}" for reason, count in self.skipped.most_common())
        if self.skipped_parts:
            text += "\n  parts left out (not text): " + ", ".join(
                f"{count} {kind}" for kind, count in self.skipped_parts.most_common())
        for example in self.bad_examples:
            text += f"\n  bad: {example}"
        return text
