"""The `tiered-recall` commands: add, search, get, delete, list, export, ingest, stats, serve, demo."""
from __future__ import annotations

import enum
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
import typer.core

from .. import __version__
from ..errors import TieredRecallError
from .interrupts import INTERRUPTED_EXIT_CODE, StopOnCtrlC
from .output import console, export_line, fail, hits_table, note, print_json, record, say

app = typer.Typer(
    name="tiered-recall",
    help="A two-tier memory store for LLM agents: a hot tier in a GPU/CPU sidecar over LanceDB on disk.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help as plain text, so option names and values read as typed
)



class PlainHelp(typer.core.TyperCommand):
    """A command whose help lists each argument by its name and words alone: no type tag such as <list[str]> beside
    it (the help says what it takes)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "argument":
                param.display_type_rich = lambda ctx: None  # the tag typer would print after the name


# How TieredMemory's messages name its options when this command line opened it.
OPTION_FLAGS = {"path": "--store", "device": "--device", "hot_capacity": "--hot-capacity", "read_only": "--read-only"}
# How ingest's messages name its options here: each keyword's flag.
INGEST_FLAGS = {name: "--" + name.replace("_", "-") for name in (
    "format", "namespace", "turns_field", "role_field", "text_field", "session_field", "time_field", "keep_system",
    "template", "context_turns", "batch_size", "skip_bad")}


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


class LogLevel(str, enum.Enum):
    """mcp --log-level: the least severe log line the server writes."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class Format(str, enum.Enum):
    """--format: the conversation formats ingest reads (docs/cli.md)."""

    auto = "auto"
    jsonl = "jsonl"
    openai = "openai"
    sharegpt = "sharegpt"
    locomo = "locomo"
    chatgpt = "chatgpt"
    claude = "claude"
    conversation = "conversation"


STORE = typer.Option(None, "--store", metavar="FOLDER",
                     help="Store folder, made if missing (default: your own store, in the user data folder).")
DEVICE = typer.Option(Device.auto, "--device", help="Hot tier: auto (CUDA where a GPU and the CUDA build are "
                      "present, else CPU), cpu, cuda, or none.")
EMBEDDER = typer.Option(None, "--embedder", metavar="NAME",
                        help="The preset's by default (an existing store keeps its own); or e5, wordllama, "
                             "wordllama:128, wordllama:64, minilm.")
PRESET = typer.Option(None, "--preset", help="quality (default: E5, keyword match, neighbouring turns) or fast "
                      "(WordLlama, microsecond embedding); an existing store keeps the one it was made with.")
HOT_CAPACITY = typer.Option(None, "--hot-capacity", metavar="ROWS", help="Rows in the hot tier when this command "
                            "starts its sidecar (default 100,000; a running one keeps its own).")
NAMESPACE = typer.Option(None, "--namespace", "-n", metavar="NAME", help="Only this namespace.")
READ_ONLY = typer.Option(False, "--read-only", help="Open the store for reading only (chosen by itself, with a note, "
                         "where the folder cannot be written).")


def _version(value: bool) -> None:
    if value:
        say(f"tiered-recall {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                              help="Print the version and exit.")) -> None:
    """A two-tier memory store for LLM agents: a hot tier in a GPU/CPU sidecar over LanceDB on disk."""


def _check_namespace(namespace: str | None) -> None:
    """-n as this command line spells it, checked before the store opens (TieredMemory's message names its keyword)."""
    if namespace == "":
        fail("-n/--namespace must be a non-empty name, e.g. -n alice")


def _open(store: Path | None, device: Device, embedder: str | None, preset: "PresetName | None",
          hot_capacity: int | None = None, read_only: bool | None = None):
    if hot_capacity is not None and hot_capacity < 1:
        fail(f"--hot-capacity must be a positive number of rows, got {hot_capacity}")
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
    if ids and len(ids) != len(texts):
        fail(f"--id is given once per text: {len(texts)} text(s) but {len(ids)} --id")
    _check_namespace(namespace)
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
    stages: bool = typer.Option(True, "--stages/--no-stages", help="Run the preset's retrieval stages (keyword match, "
                                "neighbouring turns, temporal cues; docs/recall.md), or the vector search alone."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET,
    hot_capacity: Optional[int] = HOT_CAPACITY,
    read_only: bool = READ_ONLY,
) -> None:
    """Search memories: rank, score, tier (hot or cold), role, text and age of each hit."""
    from ..coordinator.validate import MAX_K

    if not 1 <= k <= MAX_K:
        fail(f"-k must be from 1 to {MAX_K}, got {k}")
    if where is not None and not where.strip():
        fail("--where must be a SQL filter, e.g. --where \"role = 'user'\"")
    _check_namespace(namespace)
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
    preset: Optional[PresetName] = PRESET, read_only: bool = READ_ONLY,
) -> None:
    """Print memories by id, as JSON (exit code 1 when an id is not found)."""
    try:
        with _open(store, device, embedder, preset, read_only=True if read_only else None) as memory:
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
    preset: Optional[PresetName] = PRESET, read_only: bool = READ_ONLY,
) -> None:
    """The store's namespaces: memories in each, and how many the hot tier holds now."""
    from rich.table import Table
    from rich.text import Text

    try:
        with _open(store, device, embedder, preset, read_only=True if read_only else None) as memory:
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
    preset: Optional[PresetName] = PRESET, read_only: bool = READ_ONLY,
) -> None:
    """Every memory as JSON Lines, oldest first: `tiered-recall ingest` reads it back to the same memories (ids,
    namespaces, texts, roles, sessions, times, metadata)."""
    _check_namespace(namespace)
    try:
        with _open(store, device, embedder, preset, read_only=True if read_only else None) as memory, (
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
    _check_namespace(namespace)
    from ..ingest import IngestInterrupted
    from ..ingest import ingest as run_ingest
    from ..ingest.sources import expand_sources

    try:
        expand_sources(paths)  # a missing file is reported before the store and its embedder load
    except TieredRecallError as error:
        fail(error)

    ctrl_c = StopOnCtrlC(first_note="stopping after the batch being written (Ctrl-C again stops at once)...",
                         second_note="interrupted at once: every batch written before is stored, the one being written "
                                     "is stored whole or not at all; run the same command again to resume (nothing is "
                                     "stored twice)")
    summary = None
    try:
        with ctrl_c, _open(store, device, embedder, preset, hot_capacity) as memory:
            summary = run_ingest(paths, memory=memory, format=format.value, namespace=namespace,
                                 turns_field=turns_field, role_field=role_field, text_field=text_field,
                                 session_field=session_field, time_field=time_field, keep_system=keep_system,
                                 template=template, context_turns=context_turns, batch_size=batch_size,
                                 skip_bad=skip_bad, progress=False if quiet or as_json else None,
                                 stop=ctrl_c.stopping.is_set, option_names=INGEST_FLAGS)
    except IngestInterrupted as stop:
        s = stop.summary
        note(f"interrupted: {s.added + s.updated + s.unchanged} turns stored or confirmed (added {s.added}, updated "
             f"{s.updated}) of {s.turns_read} read; run the same command again to resume (nothing is stored twice)")
        raise typer.Exit(code=INTERRUPTED_EXIT_CODE)
    except TieredRecallError as error:
        fail(error)
    if as_json:
        sys.stdout.write(summary.to_json() + "\n")
    else:
        say(str(summary))


@app.command(cls=PlainHelp)
def stats(store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
          preset: Optional[PresetName] = PRESET, read_only: bool = READ_ONLY) -> None:
    """Rows per tier, namespaces and the sidecar's counters, as JSON."""
    try:
        with _open(store, device, embedder, preset, read_only=True if read_only else None) as memory:
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
               hot_capacity: Optional[int] = HOT_CAPACITY,
               log_level: LogLevel = typer.Option(LogLevel.warning, "--log-level", help="The least severe log line "
                                                  "written (on stderr, which a client shows its user; info adds a "
                                                  "line per request)."),
               log_file: Optional[Path] = typer.Option(None, "--log-file", metavar="FILE", help="Write the log "
                                                       "here instead of on stderr.")) -> None:
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
    serve(memory, log_level=log_level.value.upper(), log_file=log_file)  # closes the store when the client goes


@app.command(name="http", cls=PlainHelp)
def http_server(
    port: int = typer.Option(8765, "--port", metavar="PORT", help="Port to listen on (0: any free one)."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="HOST", help="Address to listen on: this machine only "
                             "by default; any other (0.0.0.0, a LAN address) needs a bearer token, made and kept in "
                             "the store folder if none is given."),
    token: Optional[str] = typer.Option(None, "--token", metavar="TOKEN", envvar="TIERED_RECALL_TOKEN",
                                        help="The bearer token every call must carry (or set TIERED_RECALL_TOKEN)."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", metavar="FILE", help="Tokens, one a line: TOKEN, "
                                              "or TOKEN PREFIX for a token that reaches only the namespaces under "
                                              "PREFIX (users/alice or [\"users\",\"alice\"]); mode 600."),
    scope: Optional[str] = typer.Option(None, "--scope", metavar="PREFIX", help="Limit --token to the namespaces "
                                        "under PREFIX (users/alice or [\"users\",\"alice\"])."),
    cors_origin: Optional[List[str]] = typer.Option(None, "--cors-origin", metavar="ORIGIN", help="Let web pages of "
                                                    "ORIGIN (https://app.example.com) call the API; repeatable; none "
                                                    "by default."),
    max_body_bytes: int = typer.Option(16 << 20, "--max-body-bytes", metavar="BYTES", help="The largest request "
                                       "body taken."),
    workers: int = typer.Option(1, "--workers", metavar="N", help="Server processes, each with the store open "
                                "(docs/http.md: when more than one pays)."),
    access_log: bool = typer.Option(False, "--access-log", help="Log a line per request (method, path, status)."),
    store: Optional[Path] = STORE, device: Device = DEVICE, embedder: Optional[str] = EMBEDDER,
    preset: Optional[PresetName] = PRESET, hot_capacity: Optional[int] = HOT_CAPACITY,
) -> None:
    """Serve the store over HTTP until Ctrl-C: a JSON API for agents in any language (docs/http.md, its OpenAPI
    document at /openapi.json) and a memory browser at http://HOST:PORT/."""
    try:
        from ..http.server import ServeOptions, serve
        from ..http.settings import HttpSettings
        from ..http.tokens import given_tokens, kept_token
    except ImportError as error:
        if (error.name or "").split(".")[0] == "tiered_recall":
            raise
        fail(f"the HTTP server needs FastAPI and uvicorn ({error}): pip install \"tiered-recall[http]\"")
    if workers < 1:
        fail(f"--workers must be 1 or more, got {workers}")
    options = {"path": None if store is None else str(store), "device": device.value, "hot_capacity": hot_capacity,
               "preset": None if preset is None else preset.value, "option_names": OPTION_FLAGS}
    if embedder is not None:
        options["embedder"] = embedder

    def settings_of(tokens) -> "HttpSettings":
        return HttpSettings(host=host, port=port, tokens=tokens, cors_origins=tuple(cors_origin or ()),
                            max_body_bytes=max_body_bytes)

    try:  # the options are checked before the store opens: a bad one is a plain error here
        tokens = given_tokens(host=host, token=token, token_file=token_file, scope=scope)
        settings = settings_of(tokens) if tokens is not None else None
        memory = _open(store, device, embedder, preset, hot_capacity)
    except TieredRecallError as error:
        fail(error)
    if settings is None:  # beyond loopback with no token given: the one kept in the store folder, made once
        try:
            tokens, line = kept_token(host=host, scope=scope, keep_in=memory.path)
            settings = settings_of(tokens)
        except TieredRecallError as error:
            memory.close()
            fail(error)
        typer.echo(line, err=True)  # not wrapped: the token must come out whole
    options["path"] = str(memory.path)
    note(f"tiered-recall http: the store at {memory.path}; the memory browser at http://{host}:{port}/"
         + (" (it asks for the token)" if tokens else ""))
    serve(ServeOptions(store=options, settings=settings, workers=workers, access_log=access_log), store=memory)
