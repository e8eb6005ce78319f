"""The cluster's figures, in one run, on a local Ray of this machine with an S3 server of its own (moto, in a process
of its own) or a folder as the object storage:

1. one-namespace search p50 / p99 through one Ray hop (a client off the shard's node) and through a co-located
   client (the shard's store read in this process), beside the same search on a TieredMemory over the same store in
   this process; each query down the three paths in a random order, and the median of each query's differences;
2. aggregate searches/s and adds/s with 1, 2 and 4 shards, from client processes through Ray, and the ratio to
   N x one shard's (the target is 0.8 while the machine has a core for each shard and client);
3. add p50 / p99 with object durability (committed to object storage; concurrent adds share a commit) and with
   node-local durability, and how many adds a commit carried when 8 threads add at once.

    python benchmarks/cluster.py                                   # moto S3, CPU sidecars
    python benchmarks/cluster.py --storage folder --device cuda    # the GPU machine (benchmarks/gpu_cluster.sh)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from tiered_recall.testing.timing import time_calls


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def percentiles(seconds: list[float]) -> dict:
    us = np.asarray(seconds) * 1e6
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)), "n": len(us)}


def timed(search, queries: np.ndarray) -> list[float]:
    """Seconds of search(q) for each query."""
    return [ns / 1e9 for ns in time_calls(search, queries, warmup=0)]


class Storage:
    """The object storage of the run: a moto S3 server in its own process, or a folder."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.server = None
        if kind == "moto":
            from tiered_recall.testing.cluster_parts import S3Server

            self.server = S3Server(process=True)
        self.tmp = tmp

    def config(self, name: str, **settings):
        from tiered_recall.cluster import make_config

        if self.server is not None:
            return make_config(self.server.uri(name), name=name, storage_options=self.server.options(),
                               local_root=str(self.tmp / "local"), **settings)
        return make_config(str(self.tmp / "storage" / name), name=name, local_root=str(self.tmp / "local"),
                           **settings)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def fill(memory, namespaces: list[str], rows: int, dim: int, rng: np.random.Generator, batch: int = 1000) -> None:
    for ns in namespaces:
        for lo in range(0, rows, batch):
            n = min(batch, rows - lo)
            memory.add([f"{ns} {lo + j}" for j in range(n)], vectors=unit(rng, n, dim), namespace=ns)


def hop_figures(args, storage: Storage, address: str) -> dict:
    """Search p50/p99: TieredMemory over the shard's own store in this process, the co-located client, one hop."""
    from tiered_recall import TieredMemory
    from tiered_recall.cluster import ClusterMemory, down, up

    config = storage.config("hop", dim=args.dim, device=args.device, hot_capacity=max(args.rows * 2, 1024))
    up(config, shards=1)
    rng = np.random.default_rng(1)
    try:
        with ClusterMemory(address, name="hop") as colocated, \
                ClusterMemory(address, name="hop", colocated=False) as remote:
            fill(remote, ["tenant"], args.rows, args.dim, rng)
            folder = colocated._session.layout["shards"]["shard-0"]["folder"]
            cold = {"table_uri": config.shard_table_uri("shard-0"),
                    "storage_options": config.storage_options.plain() or None}
            local = TieredMemory(Path(folder) / "store", dim=args.dim, embedder=None, cold_options=cold,
                                 device="none" if args.device == "none" else "auto", ttl_sweep_s=86400.0)
            queries = unit(rng, args.queries, args.dim)
            ways = {"local": lambda q: local.search(q, k=10, namespace="tenant"),
                    "colocated": lambda q: colocated.search(q, k=10, namespace="tenant"),
                    "remote": lambda q: remote.search(q, k=10, namespace="tenant")}
            for way in ways.values():  # warm every path (the hot tier, the caches, Ray's connection)
                timed(way, queries[:200])
            times: dict[str, list[float]] = {w: [] for w in ways}
            order = np.random.default_rng(5)
            for _ in range(args.repeat):
                for q in queries:  # each query down every path, in a random order: drift falls on all alike
                    for name in order.permutation(list(ways)):
                        t0 = time.perf_counter()
                        ways[name](q)
                        times[name].append(time.perf_counter() - t0)
            rule = local.search(queries[0], k=10, namespace="tenant", explain=True).rule
            served = colocated.stats()["colocated"]
            local.close()
    finally:
        down("hop")
    out = {w: percentiles(t) for w, t in times.items()}
    local_times = np.asarray(times["local"])
    for way in ("remote", "colocated"):  # the same query's two times, paired: the median of their differences
        out[f"{way}_minus_local_p50_us"] = float(np.median(np.asarray(times[way]) - local_times) * 1e6)
    out["rule"], out["colocated_served"] = rule, served
    return out


def _client(address: str, name: str, kind: str, seconds: float, dim: int, namespaces: list[str], seed: int,
            start_at: float, threads: int, results) -> None:
    import ray

    from tiered_recall.cluster import ClusterMemory

    ray.init(address=address, namespace="tiered_recall", log_to_driver=False, configure_logging=False)
    memory = ClusterMemory(address, name=name, colocated=False)
    counts = [0] * threads

    def work(t: int) -> None:
        rng = np.random.default_rng(seed * 100 + t)
        queries = unit(rng, 512, dim)
        done, end = 0, start_at + seconds
        while time.time() < end:
            ns = namespaces[int(rng.integers(len(namespaces)))]
            if kind == "search":
                memory.search(queries[done % 512], k=10, namespace=ns)
            else:
                memory.add(["more"], vectors=queries[done % 512], namespace=ns)
            done += 1
        counts[t] = done

    while time.time() < start_at:
        time.sleep(0.005)
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put(sum(counts))
    memory.close()
    ray.shutdown()


def throughput(address: str, name: str, kind: str, args, namespaces: list[str]) -> float:
    """Operations per second of args.clients client processes, each with args.threads threads calling through Ray
    for args.seconds."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    start_at = time.time() + args.client_start_s  # every client connected to Ray before the clock starts
    clients = [context.Process(target=_client, args=(address, name, kind, args.seconds, args.dim, namespaces, seed,
                                                     start_at, args.threads, results)) for seed in range(args.clients)]
    for client in clients:
        client.start()
    total = sum(results.get(timeout=args.seconds + 300) for _ in clients)
    for client in clients:
        client.join(timeout=60)
    return total / args.seconds


def scaling_figures(args, storage: Storage, address: str) -> dict:
    from tiered_recall.cluster import ClusterMemory, down, up

    out = {}
    namespaces = [f"t{i}" for i in range(args.namespaces)]
    for shards in args.shards:
        name = f"scale{shards}"
        up(storage.config(name, dim=args.dim, device=args.device, durability=args.scaling_durability,
                          hot_capacity=max(args.namespaces * args.scaling_rows * 2, 1024)), shards=shards)
        try:
            with ClusterMemory(address, name=name, colocated=False) as memory:
                fill(memory, namespaces, args.scaling_rows, args.dim, np.random.default_rng(2))
            searches = throughput(address, name, "search", args, namespaces)
            adds = throughput(address, name, "add", args, namespaces)
        finally:
            down(name)
        out[shards] = {"searches_per_s": searches, "adds_per_s": adds}
        print(f"  {shards} shard(s): {searches:,.0f} searches/s, {adds:,.0f} adds/s", flush=True)
    one = out[min(out)]
    for shards, figures in out.items():
        figures["searches_vs_n_times_one"] = figures["searches_per_s"] / (shards * one["searches_per_s"])
        figures["adds_vs_n_times_one"] = figures["adds_per_s"] / (shards * one["adds_per_s"])
    return out


def durability_figures(args, storage: Storage, address: str) -> dict:
    from tiered_recall.cluster import ClusterMemory, down, up

    out = {}
    rng = np.random.default_rng(3)
    for durability in ("object", "local"):
        name = f"dur-{durability}"
        up(storage.config(name, dim=args.dim, device="none", durability=durability, flush_s=1.0), shards=1)
        try:
            with ClusterMemory(address, name=name, colocated=False) as memory:
                vectors = unit(rng, args.adds, args.dim)
                memory.add(["warm"], vectors=vectors[0], namespace="d")
                one_by_one = timed(lambda v: memory.add(["x"], vectors=v, namespace="d"), vectors)
                before = memory.stats()["shards"]["shard-0"]["group_commit"]
                threads = [threading.Thread(target=lambda s=s: [memory.add(["y"], vectors=v, namespace=f"g{s}")
                                                                for v in unit(np.random.default_rng(s), 40,
                                                                              args.dim)])
                           for s in range(8)]
                t0 = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                together_s = time.perf_counter() - t0
                after = memory.stats()["shards"]["shard-0"]["group_commit"]
        finally:
            down(name)
        commits = after["commits"] - before["commits"]
        out[durability] = {**percentiles(one_by_one), "eight_threads_adds_per_s": 320 / together_s,
                           "adds_per_commit_eight_threads": (320 / commits) if commits else None}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", choices=["moto", "folder"], default="moto")
    parser.add_argument("--device", choices=["cpu", "cuda", "none"], default="cpu")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--rows", type=int, default=10_000, help="rows of the namespace the latency figures search")
    parser.add_argument("--queries", type=int, default=1000, help="searches per block and path")
    parser.add_argument("--repeat", type=int, default=3, help="alternated blocks per path")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--clients", type=int, default=2, help="client processes of the throughput figures")
    parser.add_argument("--threads", type=int, default=4, help="threads calling in each client process")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--client-start-s", type=float, default=20.0,
                        help="seconds the client processes get to start and connect before the clock starts")
    parser.add_argument("--namespaces", type=int, default=64)
    parser.add_argument("--scaling-rows", type=int, default=500, help="rows per namespace of the throughput runs")
    parser.add_argument("--scaling-durability", choices=["object", "local"], default="object")
    parser.add_argument("--adds", type=int, default=200)
    parser.add_argument("--cpus", type=int, default=None, help="CPUs the local Ray hands out (default: enough for "
                                                                "every shard, whatever the machine has)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["hop", "scaling", "durability"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import ray

    tmp = Path(tempfile.mkdtemp(prefix="trbench-", dir="/tmp"))
    storage = Storage(args.storage, tmp)
    cpus = args.cpus or max(max(args.shards) + 2, os.cpu_count() or 2)
    info = ray.init(num_cpus=cpus, num_gpus=1 if args.device == "cuda" else 0, include_dashboard=False,
                    object_store_memory=200 * 1024 * 1024, namespace="tiered_recall", log_to_driver=False,
                    _temp_dir=str(tmp / "ray"))
    address = info.address_info["gcs_address"]
    out = {"machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]}, "storage": args.storage,
           "device": args.device, "dim": args.dim, "rows": args.rows}
    try:
        if "hop" not in args.skip:
            out["search"] = hop_figures(args, storage, address)
            s = out["search"]
            print(f"search, one namespace of {args.rows:,} x {args.dim} (rule {s['rule']}), p50 / p99 us: local "
                  f"TieredMemory {s['local']['p50_us']:.0f} / {s['local']['p99_us']:.0f}; co-located client "
                  f"{s['colocated']['p50_us']:.0f} / {s['colocated']['p99_us']:.0f} "
                  f"(+{s['colocated_minus_local_p50_us']:.1f}); one Ray hop {s['remote']['p50_us']:.0f} / "
                  f"{s['remote']['p99_us']:.0f} (+{s['remote_minus_local_p50_us']:.0f})", flush=True)
        if "scaling" not in args.skip:
            print(f"throughput, {args.clients} client processes x {args.threads} threads through Ray, "
                  f"{os.cpu_count()} cores:", flush=True)
            out["scaling"] = scaling_figures(args, storage, address)
            for shards, f in out["scaling"].items():
                print(f"  {shards} shard(s): searches x{f['searches_vs_n_times_one']:.2f} of N x one shard's, adds "
                      f"x{f['adds_vs_n_times_one']:.2f}")
        if "durability" not in args.skip:
            out["add"] = durability_figures(args, storage, address)
            for durability, f in out["add"].items():
                print(f"add, {durability} durability: p50 {f['p50_us'] / 1e3:.1f} ms, p99 {f['p99_us'] / 1e3:.1f} ms;"
                      f" 8 threads: {f['eight_threads_adds_per_s']:.0f} adds/s, "
                      + (f"{f['adds_per_commit_eight_threads']:.1f} adds per commit"
                         if f["adds_per_commit_eight_threads"] else "no commit waited for (flushed every second)"),
                      flush=True)
    finally:
        ray.shutdown()
        storage.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
