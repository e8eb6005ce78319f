"""What HTTP adds to a search, in one run: the same searches through TieredMemory in this process and through
`tiered-recall http` (a separate server process on localhost, one keep-alive connection, alternated in blocks), by
vector (the hot path) and by text (the fast preset); then searches per second with C concurrent clients against
1 and 2 server workers; and, where a Chroma server can be started (--chroma PATH/TO/chroma, from a separate
virtual environment), the same vector searches and load against Chroma's own HTTP server on the same vectors.

The clients are a few lines of asyncio over raw HTTP/1.1 keep-alive connections, so that the figures are the
servers' and not a client library's.

    python benchmarks/http_latency.py [--rows 10000] [--dim 384] [--queries 2000] [--clients 8] [--seconds 8]
                                      [--workers 1 2] [--chroma /tmp/chroma-venv/bin/chroma] [--json out.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall import TieredMemory

WORDS = ("tea coffee cats dogs rain Porto trains chess jazz yoga taxes garden review meeting sister birthday "
         "vegetarian pizza Lisbon flight dentist football piano novel").split()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def unit(rng, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def pcts(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"p50_us": round(statistics.median(ordered) * 1e6, 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6, 1)}


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a JSON body, read the answer (Content-Length framed)."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def open(self) -> "Connection":
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self, path: str, body: bytes, headers: str = "") -> tuple[int, bytes]:
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its children that were waited for, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and its live children (a server's workers)."""
    total = cpu_seconds(pid)
    for child in Path(f"/proc/{pid}/task").glob("*/children"):
        for kid in child.read_text().split():
            total += cpu_seconds(int(kid))
    return total


def start(args: list[str], port: int, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 600  # N workers each import the package and open the store: slow on 2 busy cores
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[0]} exited: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{args} did not listen on {port}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def serve_store(store: Path, workers: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cli = [sys.executable, "-c", "from tiered_recall.cli import main; main()", "http", "--store", str(store),
           "--port", str(port), "--workers", str(workers), "--device", "cpu"]
    return start(cli, port), port


def alternated(direct, port: int, path: str, bodies: list[bytes], queries: list, blocks: int,
               server_pid: int) -> dict:
    """p50/p99 of direct(query) and of the same search over HTTP, alternated in blocks on one connection; and the
    CPU time each costs (this process's for direct calls, the server's for requests): a figure that other work on a
    shared machine does not inflate the way it does wall-clock latency."""
    cpu = {"direct": 0.0, "server": 0.0}

    async def run():
        conn = await Connection(port).open()
        for body in bodies[:50]:  # warm both
            await conn.post(path, body)
        for q in queries[:50]:
            direct(q)
        own, http = [], []
        size = max(1, len(bodies) // blocks)
        for lo in range(0, len(bodies), size):
            c0 = time.process_time()
            for q in queries[lo:lo + size]:
                t0 = time.perf_counter()
                direct(q)
                own.append(time.perf_counter() - t0)
            cpu["direct"] += time.process_time() - c0
            c0 = tree_cpu_seconds(server_pid)
            for body in bodies[lo:lo + size]:
                t0 = time.perf_counter()
                status, answer = await conn.post(path, body)
                http.append(time.perf_counter() - t0)
                assert status == 200, answer[:300]
            cpu["server"] += tree_cpu_seconds(server_pid) - c0
        conn.close()
        return own, http

    own, http = asyncio.run(run())
    out = {"direct": pcts(own), "http": pcts(http)}
    out["http_adds_p50_us"] = round(out["http"]["p50_us"] - out["direct"]["p50_us"], 1)
    out["direct_cpu_us"] = round(cpu["direct"] / len(own) * 1e6, 1)  # this process, the sidecar's share not counted
    out["server_cpu_us"] = round(cpu["server"] / len(http) * 1e6, 1)  # the server process, the same search inside
    out["http_adds_cpu_us"] = round(out["server_cpu_us"] - out["direct_cpu_us"], 1)
    return out


def load(port: int, path: str, bodies: list[bytes], clients: int, seconds: float, headers: str = "",
         pids: tuple[int, ...] = ()) -> dict:
    """Searches per second with `clients` connections each sending its next search when the last is answered, and
    the CPU time per search of this client and of the processes `pids` (the server, the sidecar)."""
    async def client(i: int, until: float, counts: list[int]) -> None:
        conn = await Connection(port).open()
        n = i
        while time.perf_counter() < until:
            status, answer = await conn.post(path, bodies[n % len(bodies)], headers)
            assert status == 200, answer[:300]
            counts[i] += 1
            n += clients
        conn.close()

    async def run():
        counts = [0] * clients
        await asyncio.gather(*(client(i, time.perf_counter() + 1.0, [0] * clients) for i in range(clients)))  # warm
        before = [tree_cpu_seconds(pid) for pid in pids], time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i, t0 + seconds, counts) for i in range(clients)))
        rate = sum(counts) / (time.perf_counter() - t0)
        after = [tree_cpu_seconds(pid) for pid in pids], time.process_time()
        n = max(1, sum(counts))
        used = [round((b - a) / n * 1e6, 1) for a, b in zip(before[0], after[0])]
        return rate, used, round((after[1] - before[1]) / n * 1e6, 1)

    rate, used, client_us = asyncio.run(run())
    return {"clients": clients, "searches_per_s": round(rate), "cpu_us_per_search": used, "client_cpu_us": client_us}


def vector_bodies(queries: np.ndarray, k: int) -> list[bytes]:
    return [json.dumps({"vector": [round(float(v), 6) for v in q], "k": k, "namespace": "bench"}).encode()
            for q in queries]


def chroma_peer(chroma: str, x: np.ndarray, queries: np.ndarray, k: int, clients: int, seconds: float,
                folder: Path) -> dict:
    """Chroma's own server on the same vectors: the collection made and filled with its Python client (from the
    environment of the chroma command), the queries sent by the same raw client as ours."""
    port = free_port()
    proc = start([chroma, "run", "--path", str(folder / "chroma"), "--port", str(port)], port)
    try:
        python = str(Path(chroma).parent / "python")
        np.save(folder / "x.npy", x)
        setup = (
            "import sys, numpy as np, chromadb\n"
            f"c = chromadb.HttpClient(host='127.0.0.1', port={port})\n"
            "col = c.create_collection('bench', configuration={'hnsw': {'space': 'cosine'}})\n"
            f"x = np.load({str(folder / 'x.npy')!r})\n"
            "for lo in range(0, len(x), 2000):\n"
            "    col.add(ids=[str(i) for i in range(lo, min(len(x), lo + 2000))], embeddings=x[lo:lo + 2000],\n"
            "            documents=[f'm{i}' for i in range(lo, min(len(x), lo + 2000))])\n"
            "print(col.id)\n")
        done = subprocess.run([python, "-c", setup], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        collection = done.stdout.strip().splitlines()[-1]
        path = f"/api/v2/tenants/default_tenant/databases/default_database/collections/{collection}/query"
        bodies = [json.dumps({"query_embeddings": [[round(float(v), 6) for v in q]], "n_results": k,
                              "include": ["documents", "distances", "metadatas"]}).encode() for q in queries]

        async def sequential():
            conn = await Connection(port).open()
            for body in bodies[:50]:
                await conn.post(path, body)
            times = []
            for body in bodies:
                t0 = time.perf_counter()
                status, answer = await conn.post(path, body)
                times.append(time.perf_counter() - t0)
                assert status == 200, answer[:300]
            conn.close()
            return times

        out = {"http": pcts(asyncio.run(sequential()))}
        out["load"] = load(port, path, bodies, clients, seconds)
        return out
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--chroma", help="the chroma command of a separate environment (pip install chromadb)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = unit(rng, args.rows, args.dim)
    queries = unit(rng, args.queries, args.dim)
    figures: dict = {"rows": args.rows, "dim": args.dim, "k": args.k, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="tr-http-bench-") as tmp:
        folder = Path(tmp)
        vectors, texts = folder / "vectors", folder / "texts"
        with TieredMemory(vectors, dim=args.dim, embedder=None, device="cpu", hot_capacity=args.rows + 100) as memory:
            for lo in range(0, args.rows, 5000):
                memory.add([f"m{i}" for i in range(lo, min(args.rows, lo + 5000))], vectors=x[lo:lo + 5000],
                           namespace="bench")
            figures["vector_rule"] = memory.search(queries[0], k=args.k, namespace="bench", explain=True).rule
            sidecar = memory.stats()["sidecar"]["owner_pid"]
            bodies = vector_bodies(queries, args.k)
            for workers in args.workers:
                proc, port = serve_store(vectors, workers)
                try:
                    if workers == args.workers[0]:
                        figures["vector_search"] = alternated(
                            lambda q: memory.search(q, k=args.k, namespace="bench"), port, "/v1/search", bodies,
                            list(queries), args.blocks, proc.pid)
                    figures[f"vector_load_{workers}_workers"] = load(
                        port, "/v1/search", bodies, args.clients, args.seconds, pids=(proc.pid, sidecar))
                finally:
                    stop(proc)
        text_queries = [" ".join(rng.choice(WORDS, 3)) for _ in range(min(args.queries, 1000))]
        with TieredMemory(texts, preset="fast", device="cpu") as memory:
            sentences = [" ".join(rng.choice(WORDS, 8)) + f" {i}" for i in range(2000)]
            memory.add(sentences, namespace="bench")
            text_bodies = [json.dumps({"query": q, "k": args.k, "namespace": "bench"}).encode() for q in text_queries]
            proc, port = serve_store(texts, args.workers[0])
            try:
                figures["text_search"] = alternated(lambda q: memory.search(q, k=args.k, namespace="bench"), port,
                                                    "/v1/search", text_bodies, text_queries, args.blocks, proc.pid)
                figures["text_rule"] = memory.search(text_queries[0], k=args.k, namespace="bench", explain=True).rule
            finally:
                stop(proc)
        if args.chroma:
            try:
                figures["chroma"] = chroma_peer(args.chroma, x, queries, args.k, args.clients, args.seconds, folder)
            except Exception as error:  # the peer is optional: say why it is missing
                figures["chroma"] = {"error": str(error)[-500:]}
    v = figures["vector_search"]
    print(f"vector search, {args.rows} x {args.dim}, k={args.k} (rule {figures['vector_rule']}): TieredMemory p50 "
          f"{v['direct']['p50_us']} us, HTTP p50 {v['http']['p50_us']} us (adds {v['http_adds_p50_us']} us), "
          f"HTTP p99 {v['http']['p99_us']} us; CPU a search: TieredMemory {v['direct_cpu_us']} us, the server "
          f"{v['server_cpu_us']} us (adds {v['http_adds_cpu_us']} us)")
    t = figures["text_search"]
    print(f"text search, fast preset (rule {figures['text_rule']}): TieredMemory p50 {t['direct']['p50_us']} us, HTTP "
          f"p50 {t['http']['p50_us']} us (adds {t['http_adds_p50_us']} us); CPU a search: TieredMemory "
          f"{t['direct_cpu_us']} us, the server {t['server_cpu_us']} us (adds {t['http_adds_cpu_us']} us)")
    for workers in args.workers:
        f = figures[f"vector_load_{workers}_workers"]
        print(f"{args.clients} clients, {workers} worker(s): {f['searches_per_s']} searches/s; CPU a search: server "
              f"{f['cpu_us_per_search'][0]} us, sidecar {f['cpu_us_per_search'][1]} us, client {f['client_cpu_us']} us")
    if "chroma" in figures:
        c = figures["chroma"]
        if "error" in c:
            print(f"chroma: not measured ({c['error']})")
        else:
            ours = figures[f"vector_load_{args.workers[0]}_workers"]["searches_per_s"]
            print(f"chroma, same vectors: HTTP p50 {c['http']['p50_us']} us (ours / chroma: "
                  f"{v['http']['p50_us'] / c['http']['p50_us']:.2f}), {args.clients} clients "
                  f"{c['load']['searches_per_s']} searches/s (ours / chroma: {ours / c['load']['searches_per_s']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
