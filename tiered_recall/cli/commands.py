"""The `tiered-recall` commands: add, search, get, delete, list, export, ingest, stats, serve, demo."""
from __future__ import annotations

import enum
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

import typer
import typer.core

from .. import __version__
from ..errors import TieredRecallError
from .cluster_commands import cluster_app
from .output import console, export_line, fail, hits_table, note, print_json, record, say

app = typer.Typer(
    name="tiered-recall",
    help="A two-tier memory store for LLM agents: a hot tier in a GPU/CPU sidecar over LanceDB on disk.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help as plain text, so option names and values read as typed
)
app.add_typer(cluster_app)  # `tiered-recall cluster ...` (cluster_commands.py)



class PlainHelp(typer.core.TyperCommand):
    """A command whose help lists each argument by its name and words alone: no type tag such as <list[str]> beside
    it (the help says what it takes)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "argument":
                param.display_type_rich = lambda ctx: None  # the tag typer would print after the name


# How TieredMemory's messages name its options when this command line opened it.
OPTION_FLAGS = {"device": "--device", "hot_capacity": "--hot-capacity", "read_only": "--read-only"}


class PresetName(str, enum.Enum):
    """The presets --preset takes (tiered_recall/coordinator/presets.py)."""

    quality = "quality"
    fast = "fast"


class Device(str, enum.Enum):
    """--device: where the hot tier runs (TieredMemory's device)."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    none = "none"


class Format(str, enum.Enum):
    """--format: the conversation formats ingest reads (docs/cli.md)."""

    auto = "auto"
    jsonl = "jsonl"
    openai = "openai"
    sharegpt = "sharegpt"
    locomo = "locomo"
    conversation = "conversation"


STORE = typer.Option(None, "--store", metavar="FOLDER",
                     help="Store folder, made if missing (default: your own store, in the user data folder).")
DEVICE = typer.Option(Device.auto, "--device", help="Hot tier: auto (CUDA where a GPU and the CUDA build are "
                      "present, else CPU), cpu, cuda, or none.")
EMBEDDER = typer.Option(None, "--embedder", metavar="NAME",
                        help="The preset's by default (an existing store keeps its own); or e5, wordllama, "
                             "wordllama:128, wordllama:64, minilm.")
PRESET = typer.Option(None, "--preset", help="quality (default: E5, BM25 fusion, neighbouring turns) or fast "
                      "(WordLlama, microsecond embedding); an existing store keeps the one it was made with.")
HOT_CAPACITY = typer.Option(None, "--hot-capacity", metavar="ROWS", help="Rows in the hot tier when this command "
                            "starts its sidecar (default 100,000; a running one keeps its own).")
NAMESPACE = typer.Option(None, "--namespace", "-n", metavar="NAME", help="Only this namespace.")


def _version(value: bool) -> None:
    if value:
        say(f"tiered-recall {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                              help="Print the version and exit.")) -> None:
    """A two-tier memory store for LLM agents: a hot tier in a GPU/CPU sidecar over LanceDB on disk."""


def _open(store: Path | None, device: Device, embedder: str | None, preset: "PresetName | None",
          hot_capacity: int | None = None, read_only: bool | None = None):
    from ..coordinator import PRESET_EMBEDDER, TieredMemory

    return TieredMemory(store, device=device.value, embedder=PRESET_EMBEDDER if embedder is None else embedder,
                        preset=None if preset is None else preset.value, hot_capacity=hot_capacity,
                        read_only=read_only, option_names=OPTION_FLAGS)


@app.command(cls=PlainHelp)
def add(
    texts: List[str] = typer.Argument(..., metavar="TEXT", help="One or more texts to remember."),
    namespace: str = typer.Option("default", "--namespace", "-n", metavar="NAME",
                                  help="Namespace (a user, an agent)."),
    session: Optional[str] = typer.Option(None, metavar="ID", help="Session or conversation id."),
    role: Optional[str] = typer.Option(None, metavar="WHO", help="Who said it (user, assistant, a name)."),
    metadata: Optional[str] = typer.Option(None, metavar="JSON", help="A JSON object stored with each memory."),
    ids: Optional[List[int]] = typer.Option(None, "--id", metavar="ID",
                                            help="The memory's own id (once per text): an existing id is replaced."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
    hot_capacity: Optional[int] = HOT_CAPACITY,
) -> None:
    """Remember TEXT (durable on disk when this returns); prints each memory's id."""
    try:
        meta = json.loads(metadata) if metadata else None
    except json.JSONDecodeError as error:
        fail(f"--metadata is not valid JSON: {error}")
    if meta is not None and not isinstance(meta, dict):
        fail("--metadata must be a JSON object, e.g. '{\"source\": \"chat\"}'")
    try:
        with _open(store, device, embedder, preset, hot_capacity) as memory:
            added = memory.add(list(texts), namespace=namespace, session=session, role=role, metadata=meta,
                               ids=list(ids) if ids else None)
    except TieredRecallError as error:
        fail(error)
    for i in added:
        say(str(i))


@app.command(cls=PlainHelp)
def search(
    query: str = typer.Argument(..., metavar="QUERY", help="What to look for."),
    k: int = typer.Option(10, "-k", metavar="K", help="How many hits."),
    namespace: Optional[str] = NAMESPACE,
    where: Optional[str] = typer.Option(None, metavar="SQL", help="A filter, e.g. \"role = 'user'\"."),
    hybrid: bool = typer.Option(False, "--hybrid", help="The cold tier's own BM25 fusion at equal weight, instead of "
                                "the preset's stages."),
    stages: bool = typer.Option(True, "--stages/--no-stages", help="Run the preset's retrieval stages (BM25 fusion, "
                                "neighbouring turns, temporal cues; docs/recall.md), or the vector search alone."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
    hot_capacity: Optional[int] = HOT_CAPACITY,
    read_only: bool = typer.Option(False, "--read-only", help="Open the store for search only (chosen by itself, "
                                   "with a note, where the folder cannot be written)."),
) -> None:
    """Search memories: rank, score, tier (hot or cold), role, text and age of each hit."""
    try:
        with _open(store, device, embedder, preset, hot_capacity, True if read_only else None) as memory:
            report = memory.search(query, k=k, namespace=namespace, where=where, hybrid=hybrid,
                                   stages=None if stages else False, explain=True)
            known = memory.namespaces() if namespace is not None and not report.hits else None
    except TieredRecallError as error:
        fail(error)
    if as_json:
        print_json([record(h) for h in report])
    else:
        console.print(hits_table(f"{query!r}  ({report.seconds * 1e3:.2f} ms, rule {report.rule})", report))
    if known is not None and namespace not in known:
        listed = ", ".join(f"{ns} ({v['memories']})" for ns, v in list(known.items())[:10]) or "none yet"
        note(f"no memories in namespace {namespace!r}; namespaces in this store: {listed}")


@app.command(cls=PlainHelp)
def get(
    ids: List[int] = typer.Argument(..., metavar="ID", help="Memory ids."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
) -> None:
    """Print memories by id, as JSON (exit code 1 when an id is not found)."""
    try:
        with _open(store, device, embedder, preset) as memory:
            found = memory.get(list(ids))
    except TieredRecallError as error:
        fail(error)
    print_json([record(m) for m in found if m is not None])
    missing = [str(i) for i, m in zip(ids, found) if m is None]
    if missing:
        fail(f"no memory with id {', '.join(missing)}", code=1)


@app.command(cls=PlainHelp)
def delete(
    ids: List[int] = typer.Argument(..., metavar="ID", help="Memory ids."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
) -> None:
    """Forget memories by id, from both tiers; prints how many there were."""
    try:
        with _open(store, device, embedder, preset) as memory:
            deleted = memory.delete(list(ids))
    except TieredRecallError as error:
        fail(error)
    say(f"deleted {deleted} of {len(ids)}")


@app.command(name="list", cls=PlainHelp)
def list_namespaces(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
) -> None:
    """The store's namespaces: memories in each, and how many the hot tier holds now."""
    from rich.table import Table
    from rich.text import Text

    try:
        with _open(store, device, embedder, preset) as memory:
            found = memory.namespaces()
    except TieredRecallError as error:
        fail(error)
    if as_json:
        print_json(found)
        return
    table = Table(title=f"{len(found)} namespaces, {sum(v['memories'] for v in found.values())} memories",
                  title_justify="left")
    for column in ("namespace", "memories", "hot"):
        table.add_column(column, justify="left" if column == "namespace" else "right")
    for ns, v in found.items():
        table.add_row(Text(ns), str(v["memories"]), str(v["hot"]))
    console.print(table)


@app.command(cls=PlainHelp)
def export(
    namespace: Optional[str] = NAMESPACE,
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE",
                                          help="Write here instead of to stdout."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
) -> None:
    """Every memory as JSON Lines, oldest first: `tiered-recall ingest` reads it back to the same memories (ids,
    namespaces, texts, roles, sessions, times, metadata)."""
    try:
        with _open(store, device, embedder, preset) as memory, (
                open(output, "w", encoding="utf-8") if output else _stdout()) as out:
            written = 0
            for m in memory.memories(namespace):
                out.write(export_line(m) + "\n")
                written += 1
    except TieredRecallError as error:
        fail(error)
    if output:
        note(f"exported {written} memories to {output}")


class _stdout:
    def __enter__(self):
        return sys.stdout

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()


@app.command(cls=PlainHelp)
def ingest(
    paths: List[str] = typer.Argument(..., metavar="PATH", help="Files or folders of conversation logs; '-' "
                                      "reads stdin; .gz works."),
    format: Format = typer.Option(Format.auto, "--format", "-f", help="The files' format (auto: found from each "
                                  "file's first record)."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", metavar="TEMPLATE", help="Where the memories "
                                            "go: a name, or a template with {file}, {stem}, {conversation} or "
                                            "{session} (default: each record's own, else 'default')."),
    turns_field: Optional[str] = typer.Option(None, metavar="FIELD", help="The field holding each record's list of "
                                              "turns, for one conversation per record (dotted names reach inside)."),
    role_field: Optional[str] = typer.Option(None, metavar="FIELD", help="The field holding the speaker or role."),
    text_field: Optional[str] = typer.Option(None, metavar="FIELD", help="The field holding the text."),
    session_field: Optional[str] = typer.Option(None, metavar="FIELD", help="The field holding the session id."),
    time_field: Optional[str] = typer.Option(None, metavar="FIELD", help="The field holding the time."),
    keep_system: bool = typer.Option(False, "--keep-system", help="Store system messages too (skipped by default)."),
    template: str = typer.Option("dated_said", metavar="TEMPLATE", help="How a turn is written into the embedded "
                                 "text: plain, speaker, said, dated_speaker, dated_said, or a format string with "
                                 "{text}."),
    context_turns: int = typer.Option(1, metavar="N", help="Preceding turns mixed into each turn's embedding "
                                      "(0: none)."),
    batch_size: int = typer.Option(512, metavar="N", help="Turns per embedding call and write."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed records instead of stopping."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
    hot_capacity: Optional[int] = HOT_CAPACITY,
) -> None:
    """Ingest conversation logs; safe to run again (nothing is added twice) and to stop: Ctrl-C stops at the next
    batch boundary, and running the same command again resumes."""
    from ..ingest import IngestInterrupted
    from ..ingest import ingest as run_ingest

    stopping = threading.Event()

    def on_sigint(signum, frame) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: now
        stopping.set()
        note("stopping after the batch being written (Ctrl-C again stops at once)...")

    previous = signal.signal(signal.SIGINT, on_sigint)
    summary = None
    try:
        with _open(store, device, embedder, preset, hot_capacity) as memory:
            summary = run_ingest(paths, memory=memory, format=format.value, namespace=namespace,
                                 turns_field=turns_field, role_field=role_field, text_field=text_field,
                                 session_field=session_field, time_field=time_field, keep_system=keep_system,
                                 template=template, context_turns=context_turns, batch_size=batch_size,
                                 skip_bad=skip_bad, progress=False if quiet or as_json else None,
                                 stop=stopping.is_set)
    except IngestInterrupted as stop:
        s = stop.summary
        note(f"interrupted: {s.added + s.updated + s.unchanged} turns stored or confirmed (added {s.added}, updated "
             f"{s.updated}) of {s.turns_read} read; run the same command again to resume (nothing is stored twice)")
        raise typer.Exit(code=130)
    except KeyboardInterrupt:
        note("interrupted: the batches written so far are stored; run the same command again to resume "
             "(nothing is stored twice)")
        raise typer.Exit(code=130)
    except TieredRecallError as error:
        fail(error)
    finally:
        signal.signal(signal.SIGINT, previous)
    if as_json:
        sys.stdout.write(summary.to_json() + "\n")
    else:
        say(str(summary))


@app.command(cls=PlainHelp)
def stats(store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
          preset: Optional[PresetName] = PRESET) -> None:
    """Rows per tier, namespaces and the sidecar's counters, as JSON."""
    try:
        with _open(store, device, embedder, preset) as memory:
            print_json(memory.stats())
    except TieredRecallError as error:
        fail(error)


@app.command(cls=PlainHelp)
def serve(
    name: str = typer.Option(..., metavar="NAME", help="Segment name: the sidecar serves "
                             "/dev/shm/tiered-recall.NAME."),
    dim: int = typer.Option(..., metavar="D", help="Vector dimension."),
    capacity: int = typer.Option(..., metavar="ROWS", help="Rows the hot tier keeps; a full tier evicts the least "
                                 "recently used."),
    dtype: Optional[str] = typer.Option(None, metavar="f32|f16", help="Element type (default: f32 on cpu, f16 on "
                                        "cuda)."),
    backend: str = typer.Option("cpu", metavar="cpu|cuda", help="Which backend serves."),
    slots: Optional[int] = typer.Option(None, metavar="N", help="Request slots (requests in flight at once)."),
    threads: Optional[int] = typer.Option(None, metavar="N", help="CPU search threads (default: one per core)."),
    metrics_port: Optional[int] = typer.Option(None, metavar="PORT", help="Also serve the Prometheus metrics of "
                                               "the store at --store on http://0.0.0.0:PORT/metrics (every process "
                                               "of the store added up; needs the metrics extra)."),
    store: Optional[Path] = typer.Option(None, "--store", metavar="FOLDER", help="The store whose metrics "
                                         "--metrics-port serves."),
) -> None:
    """Run a hot-tier sidecar in the foreground until Ctrl-C or SIGTERM (which remove its segment)."""
    from ..coordinator.link import serve_command

    try:
        args = serve_command(name, dim=dim, capacity=capacity, dtype=dtype, backend=backend, slots=slots,
                             threads=threads)
    except TieredRecallError as error:
        fail(error)
    sys.stdout.flush()
    if metrics_port is None:
        if store is not None:
            fail("--store names the store whose metrics --metrics-port serves: give --metrics-port too")
        os.execv(args[0], args)
    if store is None:
        fail("--metrics-port serves the metrics of a store: name it with --store FOLDER")
    from .metrics_server import serve_with_metrics

    raise typer.Exit(code=serve_with_metrics(args, store, metrics_port))


@app.command(cls=PlainHelp)
def demo(
    store: Optional[Path] = typer.Option(None, "--store", metavar="FOLDER", help="Keep the demo's store here "
                                         "(default: a temporary folder, removed at the end)."),
    device: Device = DEVICE,
) -> None:
    """Ingest the sample conversations shipped with the package, then show searches the hot tier answers alone
    beside the same searches through the cold tier."""
    from .demo import run_demo

    started = time.perf_counter()
    try:
        run_demo(store, device.value)
    except TieredRecallError as error:
        fail(error)
    note(f"demo done in {time.perf_counter() - started:.1f} s")


@app.command(name="mcp", cls=PlainHelp)
def mcp_server(store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
               preset: Optional[PresetName] = PRESET,
               hot_capacity: Optional[int] = HOT_CAPACITY) -> None:
    """Serve the store to an MCP client (Claude Desktop, an IDE, an agent) over stdin and stdout until the client
    closes it: tools to add, search, get and delete memories and to list namespaces (docs/integrations/mcp.md)."""
    try:
        from ..integrations.mcp_server import serve  # imported here: the mcp package is an optional extra
    except ImportError as error:
        if (error.name or "").split(".")[0] == "tiered_recall":
            raise  # a part of this package is missing: not what the extra installs
        fail(f"the MCP server needs the mcp package, 2.3 or later ({error}): pip install \"tiered-recall[mcp]\"")
    try:
        memory = _open(store, device, embedder, preset, hot_capacity)  # opened first: a bad option is a plain error here
    except TieredRecallError as error:
        fail(error)
    serve(memory)  # closes the store when the client goes
