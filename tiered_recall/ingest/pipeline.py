"""The ingest pipeline: sources -> records -> turns -> templated text -> embedded batches -> upserts.

Idempotent and resumable by construction: every turn's id comes from (namespace, conversation key,
position), so a re-run derives the same ids; a content hash kept in metadata tells an unchanged
turn (skipped, not re-embedded) from a changed one (updated under the same id). Each batch is
written with one all-or-nothing `memory.add` per namespace, so a run killed at any point and run
again ends with exactly the memories of one clean run. A batch's write runs on a writer thread while the next
batch is read and embedded (the embedder is the bottleneck: it never waits for a durable write); batches are
written in order, one at a time.
"""
from __future__ import annotations

import os
import string
import sys
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from ..coordinator.stages import TURN_INDEX_KEY
from ..errors import InvalidInput
from ..namespaces import validate_namespace
from .exports import SkippedParts
from .formats import FORMAT_CHOICES, read_turns
from .records import BadRecord, iter_records
from .sources import PathSpec, Source, expand_sources
from .summary import IngestSummary
from .templates import DEFAULT_TEMPLATE, TemplateFunction, resolve_template, template_name
from .turns import Turn, content_hash, turn_id
from .values import FieldMap, ReadState, SkippedTurn

DEFAULT_BATCH_SIZE = 512
# Measured on LoCoMo dev with WordLlama (benchmarks/locomo_recall.py): adding 0.3 x the previous
# turn's vector to the turn's own raised R@10 from 47 to 53, more than writing the previous turn
# into the embedded text (49); weights 0.5-1.0 let the neighbour drown the turn.
DEFAULT_CONTEXT_TURNS = 1
DEFAULT_CONTEXT_WEIGHT = 0.3
DEFAULT_NAMESPACE = "default"
MAX_CONTEXT_TURNS = 16
# Context windows are kept per conversation; JSONL files may interleave many sessions, so the
# oldest windows are dropped beyond this many (a dropped session restarts with an empty window).
MAX_OPEN_CONTEXTS = 10_000
# Vectors of recently embedded texts kept for the contexts of the batch after (a batch's last turns precede the
# next batch's first ones).
RECENT_VECTORS_KEPT = 4 * DEFAULT_BATCH_SIZE
# Placeholders of a namespace template: the file's name (its path inside a folder given), the name without folders
# and suffixes, the conversation's own name, and the session ("{source}" is the older spelling of "{file}").
NAMESPACE_FIELDS = ("file", "stem", "conversation", "session", "source")


class IngestInterrupted(Exception):
    """An ingest asked to stop (stop() returned True) stopped at a batch boundary: every batch before is stored, and
    running it again resumes (nothing is stored twice). summary: what was done."""

    def __init__(self, summary: IngestSummary) -> None:
        super().__init__(f"ingest stopped after {summary.added + summary.updated + summary.unchanged} turns "
                         f"stored or confirmed, of {summary.turns_read} read")
        self.summary = summary


class MemorySink(Protocol):
    """What ingestion needs from TieredMemory (tests use an in-memory fake with the same surface). add is called on
    ingest's writer thread, one call at a time, while get may be called on the caller's thread meanwhile."""

    embedder: Any

    def add(self, texts: list[str], *, vectors: np.ndarray | None = None, namespace: str,
            ids: Sequence[int] | None = None, session: list[str | None] | str | None = None,
            role: list[str | None] | str | None = None, metadata: list[dict | None] | dict | None = None,
            created_at: list[datetime | None] | None = None) -> list[int]:
        """Stores memories as TieredMemory.add does (an existing id is replaced); returns their ids."""
        ...

    def get(self, ids: Sequence[int]) -> list[Any]:
        """Memories by id in the order asked (None where absent), as TieredMemory.get; ingest compares their content
        hashes."""
        ...


@dataclass(frozen=True, slots=True)
class IngestProgress:
    """Handed to a progress callback after every batch. bytes_total is None when a source is stdin."""

    turns_read: int
    turns_written: int
    bytes_read: int
    bytes_total: int | None
    elapsed_s: float
    current_source: str


@dataclass(slots=True)
class _Pending:
    turn: Turn
    id: int
    namespace: str
    embedded_text: str
    # the preceding turns, written as the template writes a turn, whose vectors are mixed in (context_weight); empty
    # in text mode. A turn's context is its predecessor's own embedded text, so one embedding serves both.
    context_texts: tuple[str, ...] = ()
    turn_index: int | None = None  # the turn's place in its conversation as read: the neighbour stage's order


def _open_memory(store: str | os.PathLike[str] | None) -> MemorySink:
    try:
        from ..coordinator import TieredMemory  # imported late: ingesting into a fake store needs no lancedb
    except ImportError as error:
        raise InvalidInput(
            f"cannot open the store {store!r}: TieredMemory is not available ({error}); pass memory=..."
        ) from error
    return TieredMemory(None if store is None else os.fspath(store))  # type: ignore[call-arg, return-value]


def _namespace_resolver(namespace: str | None) -> Callable[[Turn, Source], str]:
    """Each turn's namespace: the template's, with its placeholders filled; without one, the record's own
    namespace (an export's) or "default"."""
    if namespace is None:
        return lambda turn, source: turn.namespace or DEFAULT_NAMESPACE
    if not isinstance(namespace, str):
        raise InvalidInput(f"namespace must be a str, got {type(namespace).__name__}")
    try:
        fields = [name for _, name, spec, conv in string.Formatter().parse(namespace) if name is not None]
    except ValueError as error:
        raise InvalidInput(f"namespace template {namespace!r} is not valid ({error}): use placeholders such as "
                           "{conversation}, and double braces for a literal brace") from None
    unknown = sorted(set(fields) - set(NAMESPACE_FIELDS))
    if unknown:
        raise InvalidInput(f"namespace template {namespace!r} uses unknown placeholder(s) {unknown}: use "
                           "{file}, {stem}, {conversation} or {session}")
    if not fields:
        validate_namespace(namespace)
        return lambda turn, source: namespace
    checked: dict[str, str] = {}

    def resolve(turn: Turn, source: Source) -> str:
        stem = source.name.rsplit("/", 1)[-1].split(".", 1)[0] or source.name
        name = namespace.format(file=source.name, source=source.name, stem=stem,
                                conversation=turn.conversation or turn.conversation_key, session=turn.session or "")
        if name not in checked:
            checked[name] = validate_namespace(name)
        return name

    return resolve


class _ProgressReporter:
    """A rich progress bar (bytes, turns/s, ETA) on a terminal; silent in pipes; or a user callback."""

    def __init__(self, progress: bool | Callable[[IngestProgress], Any] | None, *, bytes_total: int | None) -> None:
        self.callback = progress if callable(progress) else None
        show_bar = progress is True or (progress is None and sys.stderr.isatty())
        self.bar: Any = None
        if show_bar and self.callback is None:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("ingest {task.description}"), BarColumn(), DownloadColumn(),
                TextColumn("{task.fields[turns]:,} turns, {task.fields[rate]:,.0f} turns/s"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False,
            )
            self.bar.start()
            self.task = self.bar.add_task("", total=bytes_total, turns=0, rate=0.0)

    def update(self, state: IngestProgress) -> None:
        if self.callback is not None:
            self.callback(state)
        if self.bar is not None:
            rate = state.turns_read / state.elapsed_s if state.elapsed_s > 0 else 0.0
            self.bar.update(self.task, completed=state.bytes_read, description=state.current_source,
                            turns=state.turns_read, rate=rate)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def ingest(
    paths: PathSpec | Sequence[PathSpec],
    *,
    memory: MemorySink | None = None,
    store: str | os.PathLike[str] | None = None,
    format: str = "auto",
    namespace: str | None = None,
    role_field: str | None = None,
    text_field: str | None = None,
    session_field: str | None = None,
    time_field: str | None = None,
    turns_field: str | None = None,
    keep_system: bool = False,
    context_turns: int = DEFAULT_CONTEXT_TURNS,
    context_weight: float | None = DEFAULT_CONTEXT_WEIGHT,
    template: str | TemplateFunction = DEFAULT_TEMPLATE,
    batch_size: int = DEFAULT_BATCH_SIZE,
    skip_bad: bool = False,
    progress: bool | Callable[[IngestProgress], Any] | None = None,
    stop: Callable[[], bool] | None = None,
    option_names: Mapping[str, str] | None = None,
) -> IngestSummary:
    """Read conversation files into memories, one memory per turn. Safe to re-run and to kill.

    paths: files, folders (searched recursively for .jsonl/.ndjson/.json, optionally .gz) or "-"
        for stdin; gzip is recognised by content.
    memory: a TieredMemory (or anything with .embedder, .add, .get); when None one is opened at `store` (None:
        the user's own store).
    format: "auto" (detected per file from its first record), "jsonl", "openai", "sharegpt", "locomo", or
        "conversation" (one conversation per record, its turns the list at turns_field).
    namespace: where the memories go; None: a record's own namespace (an export's), else "default". Placeholders
        are filled per turn: {file} (the file's name, its path inside a folder given), {stem} (the name without
        folders and suffixes), {conversation} (the conversation's own id, its session, or the stem) and {session};
        namespace="chat-{conversation}" gives each conversation its own. Any other placeholder is refused.
    role_field / text_field / session_field / time_field: field names to read instead of the usual
        ones (role/from/speaker..., content/value/text..., session/session_id..., timestamp/created_at...);
        dotted names reach into nested objects ("author.role").
    turns_field: the field (dotted) holding each record's list of turns, for conversation-per-record files of any
        shape: {"dialogue": [{"speaker", "utterance"}]} goes in with turns_field="dialogue", role_field="speaker",
        text_field="utterance".
    keep_system: store system messages (role "system") too; by default they are skipped (counted as such).
    context_turns: embed each turn together with this many preceding turns of its conversation; the
        stored text is still the turn alone (one memory per turn). 0 embeds the turn alone.
    context_weight: how the preceding turns are mixed in: a number w gives the vector
        normalise(embed(template(turn)) + w * sum(embed(previous turn text))) (default 0.3, the best
        measured); None writes the preceding turns into the embedded text instead (see templates.py).
    template: how a turn is written into the embedded text: a name from TEMPLATES ("dated_said",
        the best measured on LoCoMo, is the default), a format string with {text}, or a callable.
    batch_size: turns per embedding call and per commit (one atomic add per namespace in a batch).
    skip_bad: count and skip malformed records instead of stopping at the first one. Without it a
        bad record raises InvalidInput naming file:line, after every turn before it was stored.
    progress: None shows a bar when stderr is a terminal, True always, False never; a callable gets
        an IngestProgress after every batch.
    stop: asked after every batch; when it returns True the run stops there, with IngestInterrupted (every
        batch before is stored; running the same ingest again resumes). The CLI sets it on Ctrl-C.
    option_names: how error messages name these options, where the caller spells them otherwise (the CLI passes its
        flags: {"text_field": "--text-field", ...}); by default the keywords above.

    Returns an IngestSummary (added / updated / unchanged / skipped / bad records, elapsed; .to_json()).
    """
    started = time.perf_counter()
    fields = FieldMap(role=role_field, text=text_field, session=session_field, time=time_field, turns=turns_field,
                      keep_system=bool(keep_system), option_names=dict(option_names or {}))
    _check_options(format=format, batch_size=batch_size, context_turns=context_turns, context_weight=context_weight,
                   fields=fields)
    render = resolve_template(template)
    namespace_of = _namespace_resolver(namespace)
    sources = expand_sources(paths)
    if memory is None:
        memory = _open_memory(store)
    for needed in ("embedder", "add", "get"):
        if not hasattr(memory, needed):
            raise InvalidInput(f"memory must be a TieredMemory (it has no .{needed}); pass memory=TieredMemory(...)")
    writer = _BatchWriter(memory=memory, embedder=memory.embedder, template=template_name(template),
                          context_weight=float(context_weight) if context_weight is not None else None)
    run = _Run(writer=writer, render=render, namespace_of=namespace_of, context_turns=context_turns,
               mix_vectors=context_weight is not None, batch_size=batch_size, skip_bad=skip_bad, started=started,
               sources=sources, progress=progress, stop=stop)
    try:
        for source in sources:
            run.read(source, format=format, fields=fields)
        run.writer.wait()  # the last batch's write: its error, if any, is this run's
    finally:
        run.close()
    return run.summary


def _check_options(*, format: str, batch_size: Any, context_turns: Any, context_weight: Any,
                   fields: FieldMap) -> None:
    """Every option checked before a file is opened, its message naming the option as the caller spells it."""
    if format not in FORMAT_CHOICES:
        raise InvalidInput(f"{fields.option('format')} must be one of {', '.join(FORMAT_CHOICES)}, got {format!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInput(f"{fields.option('batch_size')} must be a positive integer, got {batch_size!r}")
    if not isinstance(context_turns, int) or isinstance(context_turns, bool) or not 0 <= context_turns <= MAX_CONTEXT_TURNS:
        raise InvalidInput(f"{fields.option('context_turns')} must be an integer from 0 to {MAX_CONTEXT_TURNS}, got "
                           f"{context_turns!r}")
    for option, value in (("role_field", fields.role), ("text_field", fields.text), ("session_field", fields.session),
                          ("time_field", fields.time), ("turns_field", fields.turns)):
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidInput(f"{fields.option(option)} must be a non-empty field name, got {value!r}")
    if format not in ("auto", "conversation") and fields.turns is not None:
        raise InvalidInput(f"{fields.option('turns_field')} reads one conversation per record: use "
                           f"{fields.given('format', 'auto')} or {fields.given('format', 'conversation')}, not "
                           f"{format!r}")
    if context_weight is not None and (isinstance(context_weight, bool) or not isinstance(context_weight, (int, float))
                                       or not 0 < context_weight <= 10):
        raise InvalidInput(f"context_weight must be a number in (0, 10] or None, got {context_weight!r}")


class _Run:
    """One ingest run: reads each source's turns, keeps each conversation's context window, and writes batches,
    reporting progress after each."""

    def __init__(self, *, writer: "_BatchWriter", render, namespace_of, context_turns: int, mix_vectors: bool,
                 batch_size: int, skip_bad: bool, started: float, sources: list[Source], progress,
                 stop: Callable[[], bool] | None = None) -> None:
        self.writer, self.render, self.namespace_of = writer, render, namespace_of
        self.context_turns, self.mix_vectors = context_turns, mix_vectors
        self.batch_size, self.skip_bad, self.started = batch_size, skip_bad, started
        self.summary = IngestSummary()
        self.state = ReadState()
        self.conversations: set[tuple[str, str]] = set()
        self.turn_counts: Counter[tuple[str, str]] = Counter()
        sizes = [source.size for source in sources]
        self.bytes_total = None if any(size is None for size in sizes) else sum(sizes)  # type: ignore[arg-type]
        self.reporter = _ProgressReporter(progress, bytes_total=self.bytes_total)
        self.bytes_done = 0
        self.pending: list[_Pending] = []
        self.stop = stop

    def read(self, source: Source, *, format: str, fields: FieldMap) -> None:
        summary = self.summary
        summary.files += 1
        contexts: OrderedDict[str, deque[Turn]] = OrderedDict()
        with source.open() as (stream, raw):
            items = read_turns(iter_records(stream), source=source, format=format, fields=fields, state=self.state)
            for item in items:
                if isinstance(item, BadRecord):
                    where = f"{source.display}:{item.line}"
                    if not self.skip_bad:
                        self.flush(source, raw, wait=True)  # everything before the bad record is stored
                        raise InvalidInput(f"{where}: {item.message}; fix the record or pass "
                                           f"{fields.given('skip_bad', True)}")
                    summary.note_bad(where, item.message)
                    if not item.resumable:
                        break
                    continue
                if isinstance(item, SkippedParts):
                    summary.skipped_parts[item.kind] += item.count
                    continue
                summary.turns_read += 1
                if isinstance(item, SkippedTurn):
                    summary.skipped[item.reason] += 1
                    continue
                self.pending.append(self._pending(item, source, contexts))
                if len(self.pending) >= self.batch_size:
                    self.flush(source, raw)
            self.flush(source, raw)
            summary.formats[self.state.last_format or format] += 1
        self.bytes_done += source.size or 0

    def _pending(self, item: Turn, source: Source, contexts: "OrderedDict[str, deque[Turn]]") -> _Pending:
        namespace_name = self.namespace_of(item, source)
        if item.memory_id is not None:  # an exported memory: no conversation around it
            return _Pending(turn=item, id=item.memory_id, namespace=namespace_name, embedded_text=item.text,
                            context_texts=())
        self.conversations.add((namespace_name, item.conversation_key))
        turn_index = self.turn_counts[(namespace_name, item.conversation_key)]
        self.turn_counts[(namespace_name, item.conversation_key)] += 1
        context: Sequence[Turn] = ()
        if self.context_turns:
            window = contexts.get(item.conversation_key)
            if window is None:
                window = contexts[item.conversation_key] = deque(maxlen=self.context_turns)
                if len(contexts) > MAX_OPEN_CONTEXTS:
                    contexts.popitem(last=False)
            else:
                contexts.move_to_end(item.conversation_key)
            context = tuple(window)
            window.append(item)
        mix = self.mix_vectors
        return _Pending(
            turn=item,
            id=turn_id(namespace=namespace_name, conversation_key=item.conversation_key, position=item.position),
            namespace=namespace_name,
            embedded_text=self.render(item, () if mix else context),
            context_texts=tuple(self.render(previous, ()) for previous in context) if mix else (),
            turn_index=turn_index,
        )

    def flush(self, source: Source, raw: Any, *, wait: bool = False) -> None:
        """Hands the pending turns to the writer (their write runs while the next batch is read and embedded);
        wait: return once every batch handed over is written."""
        if self.pending:
            self.writer.write(self.pending, self.summary)
            self.pending.clear()
        stopping = self.stop is not None and self.stop()
        if wait or stopping:
            self.writer.wait()
        try:
            position = raw.tell()
        except (OSError, ValueError):
            position = 0
        s = self.summary
        self.reporter.update(IngestProgress(
            turns_read=s.turns_read, turns_written=s.added + s.updated, bytes_read=self.bytes_done + position,
            bytes_total=self.bytes_total, elapsed_s=time.perf_counter() - self.started,
            current_source=source.display,
        ))
        if stopping:
            raise IngestInterrupted(self.summary)

    def close(self) -> None:
        self.writer.close()
        self.reporter.close()
        self.summary.conversations = len(self.conversations)
        self.summary.elapsed_s = time.perf_counter() - self.started


class _BatchWriter:
    """Classifies a batch against what is stored (new / changed / unchanged), embeds the rest, and hands their
    upserts to a writer thread: one batch is written while the next is read and embedded, in order."""

    def __init__(self, *, memory: MemorySink, embedder: Any, template: str, context_weight: float | None) -> None:
        self.memory = memory
        self.context_weight = context_weight
        self.embedder = embedder
        self.embedder_name = str(getattr(embedder, "name", type(embedder).__name__))
        self.recent_vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self.template = template
        self._thread: ThreadPoolExecutor | None = None
        self._writing: Future | None = None
        self._writing_ids: set[int] = set()

    def write(self, batch: list[_Pending], summary: IngestSummary) -> None:
        summary.batches += 1
        # A conversation that repeats a position within one batch keeps its last turn (upsert order).
        unique = list({item.id: item for item in batch}.values())
        summary.skipped["same position read twice"] += len(batch) - len(unique)
        if not summary.skipped["same position read twice"]:
            del summary.skipped["same position read twice"]
        if not self._writing_ids.isdisjoint(item.id for item in unique):
            self.wait()  # what is stored for these ids is what the batch being written leaves
        stored = self.memory.get([item.id for item in unique])
        to_write: list[tuple[_Pending, str, bool]] = []
        for item, existing in zip(unique, stored):
            # The context and its weight shape the vector, so they belong to what "unchanged" means.
            embedded = "\x1e".join((item.embedded_text, *item.context_texts, repr(self.context_weight)))
            digest = content_hash(item.turn, embedded_text=embedded, embedder_name=self.embedder_name)
            if existing is None:
                to_write.append((item, digest, False))
            elif item.turn.memory_id is not None and _same_memory(existing, item):
                summary.unchanged += 1
            elif (getattr(existing, "metadata", None) or {}).get("content_hash") == digest:
                summary.unchanged += 1
            else:
                to_write.append((item, digest, True))
        if not to_write:
            return
        vectors = self._embed([item for item, _, _ in to_write])
        summary.embedded += len(to_write)
        self.wait()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiered-recall-ingest-write")
        self._writing_ids = {item.id for item, _, _ in to_write}
        self._writing = self._thread.submit(self._store, to_write, vectors, summary)

    def wait(self) -> None:
        """Returns once the batch being written is stored; raises what stopped its write."""
        writing, self._writing = self._writing, None
        self._writing_ids = set()
        if writing is not None:
            writing.result()

    def close(self) -> None:
        """Waits for the batch being written (its error, if any, is left to wait()) and stops the writer thread."""
        if self._writing is not None:
            self._writing.exception()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _store(self, to_write: list[tuple[_Pending, str, bool]], vectors: np.ndarray, summary: IngestSummary) -> None:
        by_namespace: dict[str, list[int]] = {}
        for index, (item, _, _) in enumerate(to_write):
            by_namespace.setdefault(item.namespace, []).append(index)
        for namespace_name, rows in by_namespace.items():
            chosen = [to_write[row] for row in rows]
            self.memory.add(
                [item.turn.text for item, _, _ in chosen],
                vectors=np.ascontiguousarray(vectors[rows]),
                namespace=namespace_name,
                ids=[item.id for item, _, _ in chosen],
                session=[item.turn.session for item, _, _ in chosen],
                role=[item.turn.role for item, _, _ in chosen],
                metadata=[self._metadata(item, digest) for item, digest, _ in chosen],
                created_at=[item.turn.created_at for item, _, _ in chosen],
            )
            # Counted only after the add returned: it is durable then.
            for _, _, is_update in chosen:
                if is_update:
                    summary.updated += 1
                else:
                    summary.added += 1

    def _embed(self, items: list[_Pending]) -> np.ndarray:
        # Each distinct text is embedded once: a turn's context is mostly the turn before it, embedded in the same
        # batch or kept from the batch before (recent_vectors).
        wanted = [item.embedded_text for item in items] + [text for item in items for text in item.context_texts]
        missing = list(dict.fromkeys(text for text in wanted if text not in self.recent_vectors))
        if missing:
            embed = getattr(self.embedder, "embed_passages", self.embedder)  # a sink's embedder may be a callable
            for text, vector in zip(missing, embed(missing)):  # one call: turns and contexts batch together
                self.recent_vectors[text] = vector
        vectors = np.stack([self.recent_vectors[item.embedded_text] for item in items]).astype(np.float32)
        if any(item.context_texts for item in items):
            for row, item in enumerate(items):
                for context_text in item.context_texts:
                    vectors[row] += self.context_weight * self.recent_vectors[context_text]
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        while len(self.recent_vectors) > RECENT_VECTORS_KEPT:
            self.recent_vectors.popitem(last=False)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _metadata(self, item: _Pending, digest: str) -> dict[str, Any]:
        if item.turn.memory_id is not None:
            return dict(item.turn.metadata)
        return {
            **item.turn.metadata,
            "conversation_key": item.turn.conversation_key,
            "position": item.turn.position,
            TURN_INDEX_KEY: item.turn_index,
            "template": self.template,
            "content_hash": digest,
        }


def _same_memory(existing: Any, item: _Pending) -> bool:
    """Whether the stored memory already is the exported one: same namespace, text, role, session, time and
    metadata (then nothing is embedded or written)."""
    turn = item.turn
    return (existing.namespace == item.namespace and existing.text == turn.text and existing.role == turn.role
            and existing.session == turn.session and existing.metadata == turn.metadata
            and (turn.created_at is None or existing.created_at == turn.created_at))
