"""`tiered-recall demo`: the sample conversations in a store whose hot tier holds each whole, searched hot beside
the same searches through the cold tier alone, with the rule that decided and the time each took."""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rich.table import Table
from rich.text import Text

from .output import console, say

SAMPLE_CONVERSATION = Path(__file__).resolve().parents[1] / "data" / "sample_conversation.jsonl"
QUERIES = [
    ("can we book a boat tour?", "trip planning"),
    ("when are the slides due?", "work"),
    ("medication allergies", "health"),
    ("what paint colour for the living room?", "home"),
    ("which course am I taking?", "learning"),
]
REPEATS = 50  # each search is timed this often; the median is shown


def _timed(memory, query, namespace: str) -> tuple[float, object]:
    """The median time of one search for `query` (text or its vector) and the report of the first."""
    report = memory.search(query, k=3, namespace=namespace, explain=True)  # warm: fills caches
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        memory.search(query, k=3, namespace=namespace)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), report


def _embedding_time(memory, query: str) -> tuple[float, object]:
    """The median time to embed `query` and its vector: the part of a text search that is the same in both tiers."""
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        vector = memory.embedder.embed_queries([query])[0]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), vector


def run_demo(store: Path | None, device: str) -> None:
    """Runs the demo in `store` (kept) or a temporary folder (removed at the end)."""
    from ..coordinator import TieredMemory
    from ..ingest import ingest

    folder = Path(store) if store is not None else Path(tempfile.mkdtemp(prefix="tiered-recall-demo-"))
    try:
        with TieredMemory(folder, device=device, hot_capacity=1024, policy="namespace") as memory:
            summary = ingest([str(SAMPLE_CONVERSATION)], memory=memory, namespace="{session}", progress=False)
            stats = memory.stats()
            say(f"store {folder}: {summary.added + summary.updated + summary.unchanged} memories in "
                f"{len(memory.namespaces())} namespaces (one per conversation); hot tier: "
                f"{stats['hot_backend'] or 'none'}, holding every namespace whole")
            namespaces = sorted(memory.namespaces())
            with TieredMemory(folder, device="none") as cold_only:  # the same store through its cold tier alone
                _compare(memory, cold_only, namespaces)
    finally:
        if store is None:
            shutil.rmtree(folder, ignore_errors=True)


def duration(seconds: float) -> str:
    """A time in the unit that reads best: "850 µs" below a millisecond, "4.2 ms" above."""
    return f"{seconds * 1e6:,.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.1f} ms"


def _compare(memory, cold_only, namespaces: list[str]) -> None:
    # Readable in 80 columns: the best hit goes under its query, the one column that wraps (at spaces), and the
    # figures never wrap.
    table = Table(title="the same searches, served by the hot tier and by the cold tier alone (each query embedded "
                  "once, then searched by its vector)", title_justify="left", show_lines=True)
    table.add_column("query, and its best hit", justify="left", ratio=1, overflow="fold")
    for column, justify in (("embed", "right"), ("hot tier", "right"), ("rule", "left"), ("cold tier", "right"),
                            ("same", "left")):
        table.add_column(column, justify=justify, no_wrap=True)
    embed_times, hot_times, cold_times, hot_rules = [], [], [], 0
    for query, conversation in QUERIES:
        namespace = next((ns for ns in namespaces if conversation in ns), None)
        if namespace is None:
            continue
        embed_s, vector = _embedding_time(memory, query)
        hot_s, hot = _timed(memory, vector, namespace)
        cold_s, cold = _timed(cold_only, vector, namespace)
        embed_times.append(embed_s)
        hot_times.append(hot_s)
        cold_times.append(cold_s)
        hot_rules += hot.rule in ("complete", "bound")
        same = [h.id for h in hot.hits] == [h.id for h in cold.hits]
        best = hot.hits[0].text if hot.hits else ""
        best = best[:60] + ("..." if len(best) > 60 else "")
        table.add_row(Text.assemble(query, "\n", ("→ " + best, "dim")), duration(embed_s), duration(hot_s), hot.rule,
                      duration(cold_s), "yes" if same else "no")
    console.print(table)
    if hot_times:
        embed_med = statistics.median(embed_times)
        hot_med, cold_med = statistics.median(hot_times), statistics.median(cold_times)
        # Short lines: a figure and its unit must not wrap apart in 80 columns.
        say(f"median: embed {duration(embed_med)}; search {duration(hot_med)} hot, {duration(cold_med)} cold alone "
            f"({cold_med / hot_med:.1f}x)")
        say(f"{hot_rules} of {len(hot_times)} answered by the hot tier alone, each proved exact by its rule")
        say("(complete: the hot tier holds the whole namespace)")
