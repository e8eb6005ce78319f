"""How the command line prints: errors verbatim (no markup read into the text), tables of hits and namespaces, and
JSON where every id is also a string (common JSON tools round 63-bit integers)."""
from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def fail(error: Exception | str, code: int = 2) -> NoReturn:
    """Prints "error: ..." with the message exactly as written (square brackets included) and exits."""
    err_console.print(Text.assemble(("error: ", "bold red"), str(error)))
    raise typer.Exit(code=code)


def note(message: str) -> None:
    """A line for the user on stderr, printed verbatim."""
    err_console.print(Text(message))


def say(message: str) -> None:
    """A line on stdout, printed verbatim."""
    console.print(Text(message))


def age(created_at: datetime) -> str:
    """How long ago, in the largest whole unit: 3d, 5h, 12m, 40s."""
    seconds = max(0.0, (datetime.now(timezone.utc) - created_at).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def hits_table(title: str, hits) -> Table:
    """Rank, score, tier, role, text and age of each hit."""
    table = Table(title=Text(title), title_justify="left", show_lines=False)
    for column, justify in (("#", "right"), ("score", "right"), ("tier", "left"), ("role", "left"),
                            ("text", "left"), ("age", "right")):
        table.add_column(column, justify=justify, overflow="fold" if column == "text" else "ellipsis")
    for rank, hit in enumerate(hits, 1):
        text = hit.text if len(hit.text) <= 90 else hit.text[:87] + "..."
        tier = Text(hit.tier, style="green" if hit.tier == "hot" else "yellow")
        table.add_row(str(rank), f"{hit.score:.3f}", tier, Text(hit.role or ""), Text(text), age(hit.created_at))
    return table


def record(memory: Any, **extra: Any) -> dict:
    """A Memory or Hit as JSON: id as an integer and as a string (id_str), created_at in ISO 8601."""
    out = {"id": memory.id, "id_str": str(memory.id)}
    out.update({k: v for k, v in memory.__dict__.items() if k != "id"})
    out["created_at"] = memory.created_at.isoformat()
    out.update(extra)
    return out


def print_json(value: Any) -> None:
    """value as indented JSON on stdout (anything json cannot write, datetimes among it, as its str)."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def export_line(memory: Any) -> str:
    """One memory as the JSONL that `tiered-recall ingest` reads back to the same memory (memory_id as a string)."""
    return json.dumps({"memory_id": str(memory.id), "namespace": memory.namespace, "session": memory.session,
                       "role": memory.role, "content": memory.text, "timestamp": memory.created_at.isoformat(),
                       "metadata": memory.metadata}, ensure_ascii=False)
