"""What the framework-facing paths cost, in one run: an awaited search (thread hop) against the same search inline,
a namespace-prefix search by fan-out against one filtered cold search, the LangGraph store against LangGraph's own
InMemoryStore on the same items and embeddings, a hot search through each adapter (asyncio, LangChain, LangGraph)
beside TieredMemory.search on the same store, alternated, embedding time left out, and a text search through the
MCP server (a separate process over stdio) beside the same search in this process.

    python benchmarks/frameworks_latency.py [--device cpu] [--rows 2000] [--items 2000] [--json out.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall import AsyncTieredMemory, TieredMemory
from tiered_recall.coordinator import search as search_module

try:
    from langgraph.store.base import PutOp
except ImportError:  # the LangGraph figures need the langgraph extra
    PutOp = None


def p50_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def unit(rng, n, dim):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def async_hop(folder: Path, device: str, rows: int, dim: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    x = unit(rng, rows, dim)
    queries = unit(rng, repeats + 1, dim)

    async def main():
        out = {}
        memory = AsyncTieredMemory(folder, dim=dim, embedder=None, device=device, hot_capacity=rows + 10)
        for lo in range(0, rows, 5000):
            await memory.add([f"m{i}" for i in range(lo, min(rows, lo + 5000))], vectors=x[lo:lo + 5000], namespace="n")
        sync = timed(lambda: memory.memory.search(queries[0], k=10, namespace="n"), repeats)
        out["sync_search_p50_us"] = p50_us(sync)
        hops = []
        for q in queries[:repeats]:
            t0 = time.perf_counter()
            await memory.search(q, k=10, namespace="n")
            hops.append(time.perf_counter() - t0)
        out["awaited_search_p50_us"] = p50_us(hops)
        empty = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            await asyncio.get_running_loop().run_in_executor(memory._executor, lambda: None)
            empty.append(time.perf_counter() - t0)
        out["thread_hop_alone_p50_us"] = p50_us(empty)
        rule = memory.memory.search(queries[0], k=10, namespace="n", explain=True).rule
        out["rule"] = rule
        await memory.aclose()
        return out

    return asyncio.run(main())


def prefix_search(folder: Path, device: str, dim: int, repeats: int) -> dict:
    rng = np.random.default_rng(1)
    out = {}
    with TieredMemory(folder, dim=dim, embedder=None, device=device, hot_capacity=50_000) as memory:
        for n in range(40):
            memory.add([f"u{n}-{i}" for i in range(500)], vectors=unit(rng, 500, dim), namespace=("users", f"u{n}"))
        q = unit(rng, 1, dim)[0]
        small = [("users", f"u{n}") for n in range(4)]
        for n, ns in enumerate(small):
            memory.add(["x"], vectors=q, namespace=ns + ("notes",))
        out["one_namespace_p50_us"] = p50_us(timed(lambda: memory.search(q, k=10, namespace=("users", "u1")), repeats))
        out["prefix_2_namespaces_fanout_p50_us"] = p50_us(
            timed(lambda: memory.search(q, k=10, namespace_prefix=("users", "u1")), repeats))
        out["prefix_44_namespaces_filtered_cold_p50_us"] = p50_us(
            timed(lambda: memory.search(q, k=10, namespace_prefix=("users",)), repeats))
        saved = search_module.PREFIX_FANOUT_MAX
        try:
            search_module.PREFIX_FANOUT_MAX = 0  # the same small prefix through the filtered cold search
            out["prefix_2_namespaces_filtered_cold_p50_us"] = p50_us(
                timed(lambda: memory.search(q, k=10, namespace_prefix=("users", "u1")), repeats))
            search_module.PREFIX_FANOUT_MAX = 128  # the large prefix by fan-out
            out["prefix_44_namespaces_fanout_p50_us"] = p50_us(
                timed(lambda: memory.search(q, k=10, namespace_prefix=("users",)), repeats))
        finally:
            search_module.PREFIX_FANOUT_MAX = saved
    return out


def langgraph_store(folder: Path, device: str, items: int, repeats: int) -> dict:
    from langchain_core.embeddings.fake import DeterministicFakeEmbedding
    from langgraph.store.memory import InMemoryStore

    from tiered_recall.integrations.langgraph import TieredRecallStore

    embeddings = DeterministicFakeEmbedding(size=256)
    index = {"dims": 256, "embed": embeddings, "fields": ["text"]}
    out = {}
    words = "pizza tea cats dogs rain Porto trains chess jazz yoga tax garden".split()
    rng = np.random.default_rng(2)
    values = [{"text": " ".join(rng.choice(words, 4)) + f" {i}"} for i in range(items)]
    peer = InMemoryStore(index=index)
    with TieredRecallStore(folder, index=index, device=device, hot_capacity=items * 2) as store:
        for name, target in (("tiered_recall", store), ("in_memory_store", peer)):
            t0 = time.perf_counter()
            for i, value in enumerate(values):
                target.put(("users", f"u{i % 10}"), f"k{i}", value)
            out[f"{name}_put_mean_us"] = round((time.perf_counter() - t0) / items * 1e6, 1)
            out[f"{name}_search_p50_us"] = p50_us(timed(
                lambda: target.search(("users",), query="cats and rain", limit=10), repeats))
            out[f"{name}_get_p50_us"] = p50_us(timed(lambda: target.get(("users", "u3"), "k3"), repeats))
    return out


def pcts(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"p50_us": round(ordered[len(ordered) // 2] * 1e6, 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6, 1)}


class _Precomputed:
    """Embeddings that return vectors computed beforehand, so an adapter's figure holds no embedding time."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table

    def embed_query(self, text: str) -> list[float]:
        return self.table.get(text) or self.table["q0"]  # any other text: the vector store's width probe

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(t) for t in texts]


def adapters(folder: Path, device: str, rows: int, dim: int, repeats: int) -> dict:
    """A hot search through each adapter beside TieredMemory.search on the same store and vectors, alternated."""
    from langchain_core.embeddings import Embeddings

    from tiered_recall.integrations.langchain import TieredRecallVectorStore
    from tiered_recall.integrations.langgraph import TieredRecallStore

    rng = np.random.default_rng(3)
    x = unit(rng, rows, dim)
    queries = unit(rng, 64, dim)
    texts = [f"doc {i}" for i in range(rows)]
    table = {t: v.tolist() for t, v in zip(texts, x)} | {f"q{j}": q.tolist() for j, q in enumerate(queries)}

    class Fixed(_Precomputed, Embeddings):
        pass

    out = {}
    samples: dict[str, list[float]] = {k: [] for k in ("TieredMemory.search", "AsyncTieredMemory.search",
                                                      "LangChain similarity_search_by_vector",
                                                      "TieredMemory.search (LangGraph's vectors)",
                                                      "LangGraph search")}
    # One hot tier for all of them (the LangGraph store's vectors; LangChain in a namespace of its own there): on two
    # cores a second sidecar would compete with the first for the CPU.
    with TieredRecallStore(folder / "lg", index={"dims": dim, "embed": Fixed(table), "fields": ["text"]},
                           device=device, hot_capacity=2 * rows + 10) as lg:
        lg.batch([PutOp(("n",), f"k{i}", {"text": t}) for i, t in enumerate(texts)])
        memory = lg._vectors
        lc = TieredRecallVectorStore(Fixed(table), memory=memory, namespace="lc")
        lc.add_texts(texts, ids=[f"id{i}" for i in range(rows)])
        amemory = AsyncTieredMemory.wrap(memory)
        loop = asyncio.new_event_loop()
        for round_ in range(repeats):
            q = queries[round_ % len(queries)]
            for name, call in (
                    ("TieredMemory.search", lambda: memory.search(q, k=10, namespace="lc")),
                    ("AsyncTieredMemory.search", lambda: loop.run_until_complete(amemory.search(q, k=10,
                                                                                                 namespace="lc"))),
                    ("LangChain similarity_search_by_vector", lambda: lc.similarity_search_by_vector(q.tolist(), k=10)),
                    ("TieredMemory.search (LangGraph's vectors)",
                     lambda: lg._vectors.search(q, k=10, namespace_prefix=("n",))),
                    ("LangGraph search", lambda: lg.search(("n",), query=f"q{round_ % len(queries)}", limit=10,
                                                           refresh_ttl=False))):
                t0 = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - t0)
        amemory._executor.shutdown(wait=True)
        loop.close()
    for name, values in samples.items():
        out[name] = pcts(values[10:])
    out["LangChain overhead p50_us"] = round(out["LangChain similarity_search_by_vector"]["p50_us"]
                                             - out["TieredMemory.search"]["p50_us"], 1)
    out["LangGraph overhead p50_us"] = round(out["LangGraph search"]["p50_us"]
                                             - out["TieredMemory.search (LangGraph's vectors)"]["p50_us"], 1)
    out["asyncio overhead p50_us"] = round(out["AsyncTieredMemory.search"]["p50_us"]
                                           - out["TieredMemory.search"]["p50_us"], 1)
    return out


def mcp_round_trip(folder: Path, device: str, repeats: int) -> dict:
    """A text search through `tiered-recall mcp` (the SDK's client over stdio, JSON-RPC both ways) beside the same
    TieredMemory.search in this process on the same store, alternated."""
    import os
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    texts = [f"memory {i} about {w}" for i, w in enumerate("pizza tea cats dogs rain Porto trains chess".split() * 50)]
    memory = TieredMemory(folder, device=device, hot_capacity=5000)
    memory.add(texts, namespace="n")
    cli = str(Path(sys.executable).parent / "tiered-recall")
    params = StdioServerParameters(command=cli, args=["mcp", "--store", str(folder), "--device", device],
                                   env=dict(os.environ))
    samples: dict[str, list[float]] = {"TieredMemory.search (text)": [], "MCP search_memories (text)": []}

    async def main():
        with open(os.devnull, "w") as quiet:
            async with stdio_client(params, errlog=quiet) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    for i in range(repeats):
                        query = f"what about {texts[i % len(texts)].split()[-1]}?"
                        t0 = time.perf_counter()
                        memory.search(query, k=10, namespace="n")
                        samples["TieredMemory.search (text)"].append(time.perf_counter() - t0)
                        t0 = time.perf_counter()
                        result = await session.call_tool("search_memories", {"query": query, "namespace": "n", "k": 10})
                        samples["MCP search_memories (text)"].append(time.perf_counter() - t0)
                        assert not result.is_error, result.content

    try:
        asyncio.run(main())
    finally:
        memory.close()
    out = {name: pcts(values[10:]) for name, values in samples.items()}
    out["MCP overhead p50_us"] = round(out["MCP search_memories (text)"]["p50_us"]
                                       - out["TieredMemory.search (text)"]["p50_us"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "none"])
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--items", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--adapter-rows", type=int, default=256,
                        help="rows of the adapters' store: small, so that the search itself is short beside them")
    parser.add_argument("--adapter-repeats", type=int, default=1000)
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"device": args.device, "rows": args.rows, "dim": args.dim}
        result["async"] = async_hop(Path(tmp) / "a", args.device, args.rows, args.dim, args.repeats)
        print("async:", json.dumps(result["async"]), flush=True)
        result["prefix"] = prefix_search(Path(tmp) / "p", args.device, args.dim, args.repeats)
        print("prefix:", json.dumps(result["prefix"]), flush=True)
        result["langgraph"] = langgraph_store(Path(tmp) / "l", args.device, args.items, args.repeats)
        print("langgraph:", json.dumps(result["langgraph"]), flush=True)
        result["adapters"] = adapters(Path(tmp) / "ad", args.device, args.adapter_rows, args.dim,
                                      args.adapter_repeats)
        print("adapters:", json.dumps(result["adapters"]), flush=True)
        result["mcp"] = mcp_round_trip(Path(tmp) / "m", args.device, args.repeats)
        print("mcp:", json.dumps(result["mcp"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
