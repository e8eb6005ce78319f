"""The `tiered-recall` command line: serve, add, search, stats, ingest, demo."""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import TieredRecallError

app = typer.Typer(
    name="tiered-recall",
    help="A two-tier memory store for LLM agents: a hot tier in a GPU/CPU sidecar over LanceDB on disk.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

STORE_HELP = "Store folder, created if missing (default: your own store, in the platform's user data folder)."
HOT_CAPACITY_HELP = "Rows in the hot tier when this command starts its sidecar (default 100,000; a running one keeps its own)."
READ_ONLY_HELP = "Open the store for search only (also chosen by itself, with a note, when the folder cannot be written)."
DEVICE_HELP = "Hot tier: auto (CUDA when a GPU and the CUDA build are present), cpu, cuda, or none."
SAMPLE_CONVERSATION = Path(__file__).resolve().parent / "data" / "sample_conversation.jsonl"


def _fail(error: Exception) -> None:
    err_console.print(f"[bold red]error:[/] {error}")
    raise typer.Exit(code=2)


# How TieredMemory's messages name its options when this command line opened it.
OPTION_FLAGS = {"device": "--device", "hot_capacity": "--hot-capacity", "read_only": "--read-only"}


def _open(store: Path | None, device: str, embedder: str, hot_capacity: int | None, read_only: bool | None = None):
    from .coordinator import TieredMemory

    return TieredMemory(store, device=device, embedder=embedder, hot_capacity=hot_capacity, read_only=read_only,
                        option_names=OPTION_FLAGS)


def _age(created_at: datetime) -> str:
    seconds = max(0.0, (datetime.now(timezone.utc) - created_at).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _hits_table(query: str, hits, elapsed_ms: float) -> Table:
    table = Table(title=f"{query!r}  ({elapsed_ms:.2f} ms)", title_justify="left", show_lines=False)
    for column, justify in (("#", "right"), ("score", "right"), ("tier", "left"), ("role", "left"),
                            ("text", "left"), ("age", "right")):
        table.add_column(column, justify=justify, overflow="fold" if column == "text" else "ellipsis")
    for rank, hit in enumerate(hits, 1):
        text = hit.text if len(hit.text) <= 90 else hit.text[:87] + "..."
        tier = f"[green]{hit.tier}[/]" if hit.tier == "hot" else f"[yellow]{hit.tier}[/]"
        table.add_row(str(rank), f"{hit.score:.3f}", tier, hit.role or "", text, _age(hit.created_at))
    return table


@app.command()
def serve(
    name: str = typer.Option(..., help="Segment name: the sidecar serves /dev/shm/tiered-recall.NAME."),
    dim: int = typer.Option(..., help="Vector dimension."),
    capacity: int = typer.Option(..., help="Rows the hot tier keeps; a full tier evicts the least recently used."),
    dtype: Optional[str] = typer.Option(None, help="f32 or f16 (default: f32 on cpu, f16 on cuda)."),
    backend: str = typer.Option("cpu", help="cpu or cuda."),
    slots: Optional[int] = typer.Option(None, help="Request slots (requests in flight at once)."),
    threads: Optional[int] = typer.Option(None, help="CPU search threads (default: one per core)."),
) -> None:
    """Run a hot-tier sidecar in the foreground until Ctrl-C / SIGTERM (which removes its segment)."""
    from .coordinator.link import serve_command

    try:
        args = serve_command(name, dim=dim, capacity=capacity, dtype=dtype, backend=backend, slots=slots,
                             threads=threads)
    except TieredRecallError as error:
        _fail(error)
    sys.stdout.flush()
    os.execv(args[0], args)


@app.command()
def add(
    texts: List[str] = typer.Argument(..., help="One or more texts to remember."),
    namespace: str = typer.Option("default", "--namespace", "-n", help="Namespace (e.g. a user or an agent)."),
    session: Optional[str] = typer.Option(None, help="Session or conversation id."),
    role: Optional[str] = typer.Option(None, help="Who said it (user, assistant, a name)."),
    metadata: Optional[str] = typer.Option(None, help="JSON object stored with each memory."),
    store: Optional[Path] = typer.Option(None, help=STORE_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    embedder: str = typer.Option("wordllama", help="wordllama (default, offline) or minilm."),
    hot_capacity: Optional[int] = typer.Option(None, help=HOT_CAPACITY_HELP),
) -> None:
    """Remember TEXTS (durable on disk when this returns)."""
    try:
        meta = json.loads(metadata) if metadata else None
        if meta is not None and not isinstance(meta, dict):
            raise typer.BadParameter("--metadata must be a JSON object, e.g. '{\"source\": \"chat\"}'")
        with _open(store, device, embedder, hot_capacity) as memory:
            ids = memory.add(list(texts), namespace=namespace, session=session, role=role, metadata=meta)
    except json.JSONDecodeError as error:
        _fail(ValueError(f"--metadata is not valid JSON: {error}"))
    except TieredRecallError as error:
        _fail(error)
    for i in ids:
        console.print(i)


@app.command()
def search(
    query: str = typer.Argument(..., help="What to look for."),
    k: int = typer.Option(10, "-k", help="How many hits."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Only this namespace."),
    where: Optional[str] = typer.Option(None, help="SQL filter, e.g. \"role = 'user'\"."),
    hybrid: bool = typer.Option(False, "--hybrid", help="Fuse BM25 keyword ranking with the vector ranking."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    store: Optional[Path] = typer.Option(None, help=STORE_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    embedder: str = typer.Option("wordllama", help="wordllama (default, offline) or minilm."),
    hot_capacity: Optional[int] = typer.Option(None, help=HOT_CAPACITY_HELP),
    read_only: bool = typer.Option(False, "--read-only", help=READ_ONLY_HELP),
) -> None:
    """Search memories: a table of rank, score, tier, role, text and age."""
    try:
        with _open(store, device, embedder, hot_capacity, True if read_only else None) as memory:
            t0 = time.perf_counter()
            hits = memory.search(query, k=k, namespace=namespace, where=where, hybrid=hybrid)
            elapsed = (time.perf_counter() - t0) * 1e3
    except TieredRecallError as error:
        _fail(error)
    if as_json:
        print(json.dumps([{**h.__dict__, "created_at": h.created_at.isoformat()} for h in hits], indent=2))
    else:
        console.print(_hits_table(query, hits, elapsed))


@app.command()
def stats(
    store: Optional[Path] = typer.Option(None, help=STORE_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    embedder: str = typer.Option("wordllama", help="wordllama (default, offline) or minilm."),
) -> None:
    """Rows per tier, namespaces and the sidecar's counters, as JSON."""
    try:
        with _open(store, device, embedder, None) as memory:
            print(json.dumps(memory.stats(), indent=2, default=str))
    except TieredRecallError as error:
        _fail(error)


@app.command()
def ingest(
    paths: List[str] = typer.Argument(..., help="Files or folders of conversation logs; '-' reads stdin; .gz works."),
    format: str = typer.Option("auto", "--format", "-f", help="auto, jsonl, openai, sharegpt or locomo."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n",
                                            help="Namespace; '{conversation}' gives each conversation its own."),
    role_field: Optional[str] = typer.Option(None, help="Field holding the speaker/role (dotted names reach inside)."),
    text_field: Optional[str] = typer.Option(None, help="Field holding the message text."),
    session_field: Optional[str] = typer.Option(None, help="Field holding the session / conversation id."),
    time_field: Optional[str] = typer.Option(None, help="Field holding the timestamp."),
    template: str = typer.Option("dated_said", help="How a turn is written into the embedded text."),
    context_turns: int = typer.Option(1, help="Preceding turns mixed into each turn's embedding (0 = none)."),
    batch_size: int = typer.Option(512, help="Turns per embedding call and commit."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed records instead of stopping."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    store: Optional[Path] = typer.Option(None, help=STORE_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    embedder: str = typer.Option("wordllama", help="wordllama (default, offline) or minilm."),
    hot_capacity: Optional[int] = typer.Option(None, help=HOT_CAPACITY_HELP),
) -> None:
    """Ingest conversation logs; safe to re-run (nothing is added twice) and to kill (re-run resumes)."""
    from .ingest import ingest as run_ingest

    try:
        with _open(store, device, embedder, hot_capacity) as memory:
            summary = run_ingest(paths, memory=memory, format=format, namespace=namespace, role_field=role_field,
                                 text_field=text_field, session_field=session_field, time_field=time_field,
                                 template=template, context_turns=context_turns, batch_size=batch_size,
                                 skip_bad=skip_bad, progress=False if quiet or as_json else None)
    except TieredRecallError as error:
        _fail(error)
    if as_json:
        print(summary.to_json())
    else:
        console.print(str(summary))


@app.command()
def demo(
    store: Optional[Path] = typer.Option(None, help="Store folder (default: a fresh temporary folder)."),
    device: str = typer.Option("auto", help=DEVICE_HELP),
) -> None:
    """Ingest a small sample conversation shipped with the package, then run a few searches."""
    import tempfile

    from .ingest import ingest as run_ingest
    from .coordinator import TieredMemory

    folder = store or Path(tempfile.mkdtemp(prefix="tiered-recall-demo-"))
    queries = [
        ("can we book a boat tour?", None),
        ("when are the slides due?", None),
        ("medication allergies", None),
        ("what paint colour for the living room?", "demo"),
    ]
    try:
        t0 = time.perf_counter()
        with TieredMemory(folder, device=device, hot_capacity=8) as memory:
            opened = time.perf_counter() - t0
            summary = run_ingest([str(SAMPLE_CONVERSATION)], memory=memory, namespace="demo", progress=False)
            console.print(f"[bold]store[/] {folder}  (opened in {opened:.2f} s, hot tier: "
                          f"{memory.stats()['hot_backend'] or 'none'}, capacity 8 rows so older memories live only on disk)")
            console.print(str(summary))
            for query, namespace in queries:
                t1 = time.perf_counter()
                hits = memory.search(query, k=3, namespace=namespace)
                console.print(_hits_table(query, hits, (time.perf_counter() - t1) * 1e3))
            s = memory.stats()
            console.print(f"hot rows {s['hot_rows']} / cold rows {s['cold_rows']}; searches answered by the hot "
                          f"tier alone: {s['hot_hit_rate'] or 0:.0%}")
    except TieredRecallError as error:
        _fail(error)


def main() -> None:
    """The tiered-recall command's entry point."""
    app()


if __name__ == "__main__":
    main()
