"""Soak (issue 8, part 5): mixed operations from many processes on one store (search, add, delete, re-ingest);
resident memory, open file descriptors, shared-memory segments and GPU memory before and after, printed.

    python benchmarks/soak.py --processes 8 --ops 1000000

--ops is the total over all processes. Before = the store open and its sidecar warm; after = every worker
done and closed, the sidecar gone once orphaned. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

DIM = 32


def embed(texts):
    """A deterministic bag-of-hashes embedder (no model load in 8 processes)."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in t.split():
            out[i, hash(w) % DIM] += 1.0
        out[i, 0] += 0.01
    return out


def _open(store: Path):
    from tiered_recall.memory import TieredMemory

    return TieredMemory(store, embedder=embed, device="cpu", hot_capacity=20_000, timeout_s=5.0, orphan_grace_s=2.0)


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def shm_segments() -> list[str]:
    return sorted(p for p in os.listdir("/dev/shm") if p.startswith("tiered-recall."))


def gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        return int(out.stdout.split()[0]) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def _worker(store: str, worker: int, ops: int, chat: str, queue) -> None:
    from tiered_recall import ingest
    from tiered_recall.errors import TieredRecallError

    rng = np.random.default_rng(worker)
    words = "apple river mountain coffee train doctor garden holiday budget slides vet allergy".split()
    counts = {"search": 0, "add": 0, "delete": 0, "ingest": 0, "errors": 0}
    mine: list[int] = []
    memory = _open(Path(store))
    rss_start = rss_kb(os.getpid())
    try:
        for i in range(ops):
            r = rng.random()
            try:
                if r < 0.85 or not mine:
                    memory.search(" ".join(rng.choice(words, 3)), k=5, namespace=f"w{worker}" if r < 0.5 else None)
                    counts["search"] += 1
                if r >= 0.85 and r < 0.93 or not mine:
                    mine += memory.add([" ".join(rng.choice(words, 6)) + f" {worker}-{i}"], namespace=f"w{worker}")
                    counts["add"] += 1
                elif r >= 0.93 and r < 0.97:
                    memory.delete([mine.pop(int(rng.integers(len(mine))))])
                    counts["delete"] += 1
                elif r >= 0.97:
                    ingest([chat], memory=memory, namespace="chat", progress=False)  # re-ingest: adds nothing new
                    counts["ingest"] += 1
            except TieredRecallError:
                counts["errors"] += 1
    finally:
        rss_end = rss_kb(os.getpid())
        memory.close()
    queue.put({"worker": worker, **counts, "rss_start_kb": rss_start, "rss_end_kb": rss_end})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--ops", type=int, default=1_000_000, help="total operations over all processes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tr-soak-") as tmp:
        store = Path(tmp) / "store"
        chat = Path(tmp) / "chat.jsonl"
        chat.write_text("".join(json.dumps({"session": "s1", "role": "user", "content": f"soak turn {i} about coffee"}) + "\n"
                                for i in range(20)))
        shm_before = shm_segments()
        gpu_before = gpu_used_mib()
        memory = _open(store)
        memory.add(["seed memory about apples"], namespace="w0")
        from tiered_recall.ingest import ingest

        ingest([str(chat)], memory=memory, namespace="chat", progress=False)
        sidecar = memory._hot.owner_pid if memory._hot is not None else 0
        me = os.getpid()
        # warm-up: a first round so lazy imports and caches are in "before"
        for _ in range(50):
            memory.search("coffee", k=5)
        before = {"sidecar_rss_kb": rss_kb(sidecar), "sidecar_fds": fds(sidecar), "parent_rss_kb": rss_kb(me),
                  "parent_fds": fds(me), "shm_segments": len(shm_segments()), "gpu_used_mib": gpu_used_mib()}
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        per = max(1, args.ops // args.processes)
        t0 = time.monotonic()
        procs = [ctx.Process(target=_worker, args=(str(store), w, per, str(chat), queue)) for w in range(args.processes)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=24 * 3600) for _ in procs]
        for p in procs:
            p.join(60)
        elapsed = time.monotonic() - t0
        for _ in range(50):
            memory.search("coffee", k=5)
        after_open = {"sidecar_rss_kb": rss_kb(sidecar), "sidecar_fds": fds(sidecar), "parent_rss_kb": rss_kb(me),
                      "parent_fds": fds(me), "shm_segments": len(shm_segments()), "gpu_used_mib": gpu_used_mib()}
        rows = memory.count()
        memory.close()
        deadline = time.monotonic() + 30
        while shm_segments() != shm_before and time.monotonic() < deadline:
            time.sleep(0.2)
        after_close = {"shm_segments": len(shm_segments()), "shm_same_as_start": shm_segments() == shm_before,
                       "sidecar_exited": rss_kb(sidecar) is None, "gpu_used_mib": gpu_used_mib(),
                       "gpu_before_open_mib": gpu_before}
        totals = {k: sum(r[k] for r in results) for k in ("search", "add", "delete", "ingest", "errors")}
        print(json.dumps({"processes": args.processes, "ops": sum(totals[k] for k in ("search", "add", "delete", "ingest")),
                          **totals, "seconds": round(elapsed, 1), "rows_at_end": rows, "before": before,
                          "after_workers_closed_store_open": after_open, "after_everything_closed": after_close,
                          "worker_rss_kb": [(r["rss_start_kb"], r["rss_end_kb"]) for r in results]}))


if __name__ == "__main__":
    main()
