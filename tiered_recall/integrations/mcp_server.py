"""An MCP server over one TieredMemory on stdin/stdout (`tiered-recall mcp`): tools to add, search, get and delete
memories and to list namespaces, for any MCP client (Claude Desktop, an IDE, an agent framework); needs the mcp
extra (pip install "tiered-recall[mcp]"). docs/integrations/mcp.md describes the tools."""
from __future__ import annotations

import functools
import logging
import os
import re
import signal
import threading
from typing import Annotated, Any, Callable, Optional, Union

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, WithJsonSchema

from .. import __version__
from ..coordinator import TieredMemory
from ..coordinator.validate import MAX_ID, MAX_K
from ..errors import InvalidInput, TieredRecallError

__all__ = ["build_server", "serve", "StoredMemory", "FoundMemory", "Added", "Searched", "Got", "Deleted",
           "NamespaceCount", "Namespaces"]

logger = logging.getLogger(__name__)

SERVER_NAME = "tiered-recall"
INSTRUCTIONS = (
    "Long-term memory that outlives this conversation. Search it (search_memories) before answering anything that "
    "may depend on what was said or learned before; store facts, preferences and decisions worth keeping "
    "(add_memories), one short self-contained statement per text. Namespaces keep users or agents apart: use the "
    "same namespace for the same user. Ids are 63-bit integers: pass them back as the id_str strings the tools "
    "return, which no JSON tool rounds."
)
# How long closing waits for a tool call still running on a worker thread before closing the store regardless.
CLOSE_WAIT_S = 30.0
# What the server logs by default: warnings and errors only. A client shows a stdio server's stderr to its user (a
# terminal, a log pane); a line for every request (the SDK's INFO) is noise there. serve(log_level=...) and
# `tiered-recall mcp --log-level INFO` (or --log-file) bring them back.
DEFAULT_LOG_LEVEL = "WARNING"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DIGITS = re.compile(r"[0-9]+")

# ---- argument types ------------------------------------------------------------------------------
# Ranges and patterns below are advertised in the JSON schema but checked by this module and the store, not by
# pydantic: an out-of-range argument then comes back with the store's own message (the one the Python API and the
# command line give, naming the fix) instead of a pydantic validation dump.
MemoryId = Annotated[
    Union[
        Annotated[int, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_ID})],
        Annotated[str, WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,19}$"})],
    ],
    Field(description="A memory id: an integer, or the same digits as a string (the id_str the tools return; "
                      "exact where JSON numbers lose digits past 2**53)."),
]
Ids = Annotated[list[MemoryId], Field(description="Memory ids, as integers or strings of digits.",
                                      json_schema_extra={"minItems": 1})]
Namespace = Annotated[str, Field(description="Namespace: a user, an agent or a project; memories in one namespace "
                                             "are searched apart from the others (at most 256 bytes).",
                                 json_schema_extra={"minLength": 1})]

Metadata = Annotated[Optional[dict[str, Any]], Field(description="A JSON object stored with each memory, e.g. "
                                                                 "{\"source\": \"chat\"}.")]


# ---- results -------------------------------------------------------------------------------------
class StoredMemory(BaseModel):
    """One memory as the tools return it: the id as an integer and as a string (id_str), the time in ISO 8601."""

    id: int = Field(description="The memory's id (up to 2**63 - 1; read id_str where JSON numbers lose digits).")
    id_str: str = Field(description="The id as a string of digits: exact in every JSON tool.")
    text: str = Field(description="The memory's text.")
    namespace: str = Field(description="Its namespace.")
    session: Optional[str] = Field(description="Session or conversation id, if one was given.")
    role: Optional[str] = Field(description="Who said it (user, assistant, a name), if one was given.")
    created_at: str = Field(description="When it was stored, ISO 8601 in UTC.")
    metadata: dict[str, Any] = Field(description="The JSON object stored with it ({} when none).")

    @classmethod
    def of(cls, memory: Any) -> "StoredMemory":
        """From a tiered_recall Memory (or Hit): the fields the tools return."""
        return cls(id=memory.id, id_str=str(memory.id), text=memory.text, namespace=memory.namespace,
                   session=memory.session, role=memory.role, created_at=memory.created_at.isoformat(),
                   metadata=memory.metadata or {})


class FoundMemory(StoredMemory):
    """One search hit: a memory with its score and the tier that served it."""

    score: float = Field(description="Cosine similarity to the query (higher is closer).")
    tier: str = Field(description="Which tier served it: hot (the in-memory sidecar) or cold (on disk).")

    @classmethod
    def of(cls, hit: Any) -> "FoundMemory":
        """From a tiered_recall Hit."""
        return cls(**StoredMemory.of(hit).model_dump(), score=hit.score, tier=hit.tier)


class Added(BaseModel):
    """What add_memories stored: one id per text, in the order of the texts."""

    ids: list[int] = Field(description="The memories' ids, one per text, in order.")
    id_strs: list[str] = Field(description="The same ids as strings of digits.")
    namespace: str = Field(description="The namespace they went into.")


class Searched(BaseModel):
    """What search_memories found, best first."""

    hits: list[FoundMemory] = Field(description="The memories closest to the query, best first.")
    rule: str = Field(description="What decided the answer: complete, bound or threshold (the hot tier alone), "
                                  "cold, no-hot or hybrid (the cold tier searched).")
    note: Optional[str] = Field(None, description="A hint when nothing was found, e.g. that the namespace asked "
                                                  "for holds no memories, with the namespaces there are.")


class Got(BaseModel):
    """The memories get_memories was asked for, in the order asked."""

    memories: list[StoredMemory] = Field(description="The memories, in the order of the ids asked for.")


class Deleted(BaseModel):
    """What delete_memories removed."""

    deleted: int = Field(description="How many of the ids asked for were memories (now removed from both tiers).")
    asked: int = Field(description="How many ids were asked for.")


class NamespaceCount(BaseModel):
    """One namespace and its memories."""

    namespace: str = Field(description="The namespace's name.")
    memories: int = Field(description="Memories in it.")
    hot: int = Field(description="How many of them the hot tier holds now.")


class Namespaces(BaseModel):
    """Every namespace of the store, by name."""

    namespaces: list[NamespaceCount] = Field(description="Every namespace, by name.")
    memories: int = Field(description="Memories in the whole store.")


# ---- the server ----------------------------------------------------------------------------------
def _ids(values: list[int | str]) -> list[int]:
    """Ids as ints: integers or strings of digits, each in 0 .. 2**63 - 1 (the store would wrap a larger one)."""
    if not values:
        raise InvalidInput("ids is empty: give at least one memory id")
    out = []
    for value in values:
        if isinstance(value, str):
            if not _DIGITS.fullmatch(value):
                raise InvalidInput(f"ids must be integers or strings of digits, got {value!r:.80}")
            value = int(value)
        if not 0 <= value <= MAX_ID:
            raise InvalidInput(f"ids must be between 0 and 2**63 - 1, got {value}")
        out.append(value)
    return out


def _error(message: str, *more: str) -> CallToolResult:
    """A tool error the client shows the model: the message exactly as written, then any further text blocks."""
    return CallToolResult(content=[TextContent(type="text", text=text) for text in (message, *more)], is_error=True)


class _Missing(Exception):
    """get_memories found no memory for some ids: an error result that still carries the ones it found."""

    def __init__(self, message: str, found: list[StoredMemory]) -> None:
        super().__init__(message)
        self.found = found


def build_server(memory: TieredMemory, lock: threading.Lock | None = None, *,
                 log_level: str = DEFAULT_LOG_LEVEL) -> MCPServer:
    """An MCPServer with the memory tools over `memory` (open, and left open: serve() closes it); each call holds
    `lock` (a new one when None) while it uses the store. log_level: what the SDK's logging set-up lets through
    (it configures the root logger once, on stderr, where nothing configured it before).

    Tool calls run one at a time: the SDK runs each synchronous tool on a worker thread and would run a pipelining
    client's calls side by side, while the store is exercised (and tested) across processes, not across threads
    of one. A TieredRecallError (or an argument this module refuses) becomes an is_error result whose text is its
    message, and the server goes on serving.
    """
    if log_level not in LOG_LEVELS:
        raise InvalidInput(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    server: MCPServer = MCPServer(SERVER_NAME, title="tiered-recall memory", version=__version__,
                                  instructions=INSTRUCTIONS, log_level=log_level,  # type: ignore[arg-type]
                                  description="A two-tier memory store for LLM agents: add, search, get and delete "
                                              "memories, list namespaces.")
    lock = lock if lock is not None else threading.Lock()

    def tool(title: str, **hints: Any) -> Callable[[Callable[..., BaseModel]], Callable[..., Any]]:
        """Registers a tool body that returns a result model; the store's errors come back as tool errors."""

        def register(body: Callable[..., BaseModel]) -> Callable[..., Any]:
            @functools.wraps(body)  # the SDK reads the name and the input schema from body's signature
            def call(**arguments: Any) -> Any:
                try:
                    with lock:
                        return body(**arguments)
                except _Missing as missing:
                    return _error(str(missing), Got(memories=missing.found).model_dump_json(indent=2))
                except TieredRecallError as error:
                    return _error(str(error))

            # the docstring as one paragraph: the SDK would pass on its line breaks and indentation
            server.add_tool(call, title=title, description=" ".join((body.__doc__ or "").split()),
                            annotations=ToolAnnotations(title=title, **hints))
            return call

        return register

    # destructive: an add with ids replaces the memories of those ids; not idempotent: without ids, new memories
    @tool("Add memories", read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)
    def add_memories(
        texts: Annotated[list[str], Field(description="The texts to remember, one memory each: short, "
                                                      "self-contained statements.",
                                          json_schema_extra={"minItems": 1})],
        namespace: Namespace = "default",
        role: Annotated[Optional[str], Field(description="Who said them (user, assistant, a name); one for "
                                                         "all the texts.")] = None,
        session: Annotated[Optional[str], Field(description="Session or conversation id; one for all the "
                                                            "texts.")] = None,
        metadata: Metadata = None,
        ids: Annotated[Optional[list[MemoryId]], Field(description="Your own ids, one per text (integers or "
                                                                   "strings of digits): a memory of an existing "
                                                                   "id is replaced. Left out: new ids.")] = None,
    ) -> Added:
        """Store memories (durable on disk when this returns) and return their ids, one per text."""
        if not texts:
            raise InvalidInput("texts is empty: give at least one text to remember")
        own = _ids(ids) if ids is not None else None
        if own is not None and len(own) != len(texts):
            raise InvalidInput(f"ids has {len(own)} values for {len(texts)} texts: give one id per text, or none")
        added = memory.add(texts, namespace=namespace, ids=own, session=session, role=role, metadata=metadata)
        return Added(ids=added, id_strs=[str(i) for i in added], namespace=namespace)

    @tool("Search memories", read_only_hint=True, open_world_hint=False)
    def search_memories(
        query: Annotated[str, Field(description="What to look for, in words: memories are ranked by meaning.",
                                    json_schema_extra={"minLength": 1})],
        namespace: Annotated[Optional[str], Field(description="Only this namespace (left out: every "
                                                              "namespace).")] = None,
        k: Annotated[int, Field(description=f"How many memories to return, 1 to {MAX_K}.",
                                json_schema_extra={"minimum": 1, "maximum": MAX_K})] = 10,
        where: Annotated[Optional[str], Field(description="A SQL filter over session, role, created_at and "
                                                          "metadata, e.g. \"role = 'user'\" or \"session = "
                                                          "'s1'\".")] = None,
        hybrid: Annotated[bool, Field(description="Also rank by keywords (BM25) and fuse the two rankings: for "
                                                  "names, codes and rare words.")] = False,
    ) -> Searched:
        """Search memories by meaning, best first: each hit has its text, score, role, session, time, metadata and
        id (as id_str too)."""
        report = memory.search(query, k=k, namespace=namespace, where=where, hybrid=hybrid, explain=True)
        note = None
        if namespace is not None and not report.hits:
            known = memory.namespaces()
            if namespace not in known:
                listed = ", ".join(f"{ns} ({v['memories']})" for ns, v in list(known.items())[:10]) or "none yet"
                note = f"no memories in namespace {namespace!r}; namespaces in this store: {listed}"
        return Searched(hits=[FoundMemory.of(hit) for hit in report.hits], rule=report.rule, note=note)

    @tool("Get memories", read_only_hint=True, open_world_hint=False)
    def get_memories(ids: Ids) -> Got:
        """Get memories by id, in the order asked; an id with no memory is an error that names it (the memories
        found come with it)."""
        asked = _ids(ids)
        found = memory.get(asked)
        memories = [StoredMemory.of(m) for m in found if m is not None]
        missing = [str(i) for i, m in zip(asked, found) if m is None]
        if missing:
            raise _Missing(f"no memory with id {', '.join(missing)}", memories)
        return Got(memories=memories)

    @tool("Delete memories", read_only_hint=False, destructive_hint=True, idempotent_hint=True,
          open_world_hint=False)
    def delete_memories(ids: Ids) -> Deleted:
        """Forget memories by id, from both tiers; returns how many of them there were (ids with no memory are
        skipped)."""
        asked = _ids(ids)
        return Deleted(deleted=memory.delete(asked), asked=len(asked))

    @tool("List namespaces", read_only_hint=True, open_world_hint=False)
    def list_namespaces() -> Namespaces:
        """Every namespace of the store, with how many memories each holds (and how many of them are hot)."""
        found = memory.namespaces()
        return Namespaces(namespaces=[NamespaceCount(namespace=ns, memories=v["memories"], hot=v["hot"])
                                      for ns, v in found.items()],
                          memories=sum(v["memories"] for v in found.values()))

    return server


class _Closer:
    """Closes the store once, after the tool call in flight, on whichever comes first: the end of serving or a
    signal."""

    def __init__(self, memory: TieredMemory, lock: threading.Lock) -> None:
        self.memory, self.lock, self.started = memory, lock, False

    def close(self) -> None:
        """Closes the store (a second call, or one while closing, does nothing)."""
        if self.started:
            return
        self.started = True
        waited = self.lock.acquire(timeout=CLOSE_WAIT_S)
        try:
            self.memory.close()
        finally:
            if waited:
                self.lock.release()
        logger.info("tiered-recall mcp: closed the store at %s", self.memory.path)

    def on_signal(self, signum: int, frame: Any) -> None:
        """SIGTERM or SIGINT: close the store and exit now. Unwinding the event loop instead would wait for ever on
        the SDK's stdin reader, a worker thread blocked in read() that no cancellation reaches. A signal that
        arrives while the store is closing is ignored, so that the close finishes."""
        if self.started:
            return
        status = 0
        try:
            self.close()
        except BaseException:
            logger.exception("tiered-recall mcp: closing the store at %s failed", self.memory.path)
            status = 1
        finally:
            logging.shutdown()  # flush the log lines: os._exit skips it
            os._exit(status)


def serve(memory: TieredMemory, *, log_level: str = DEFAULT_LOG_LEVEL,
          log_file: str | os.PathLike | None = None) -> None:
    """Serves `memory` over MCP on stdin/stdout until the client closes stdin (or sends SIGTERM, or Ctrl-C), then
    closes it. While serving, stray writes to stdout (a library, a child process) go to stderr: the SDK points
    file descriptor 1 there and keeps the protocol on its own copy. Logs from log_level up go to stderr (by default
    warnings and errors only: a client shows them to its user), or to log_file instead."""
    lock = threading.Lock()  # held by each tool call; closing takes it to wait for the call in flight
    closer = _Closer(memory, lock)
    try:
        if log_file is not None:  # configured first: the SDK's own set-up then leaves the root logger as it is
            logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                                handlers=[logging.FileHandler(log_file, encoding="utf-8")])
        server = build_server(memory, lock, log_level=log_level)
    except BaseException:
        closer.close()
        raise
    # A client stops its server by closing stdin, then SIGTERM after a grace period: either way the store is closed
    # (its log flushed into LanceDB) rather than left for the next open to replay.
    previous = {signum: signal.signal(signum, closer.on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run("stdio")
    finally:
        closer.close()  # before the handlers go back: a SIGTERM meanwhile must not cut the close short
        for signum, handler in previous.items():
            signal.signal(signum, handler)
