"""Batched search: many client processes searching at once, each checking its own answers.

The server gathers every SEARCH published when it passes over the ring and answers them in one
backend call (search_many: on CUDA one pass over the rows for all queries, tensor cores). On CPU
the same server path runs with --test-batched-server (a loop over search()), so the slot handling
is checked everywhere; the CUDA case runs on the GPU machine with --test-poison-results
(conftest.cuda_options), so a result the kernels failed to write shows up as garbage.

Each client regenerates the rows from the shared seed and checks, per query: hit count, no
duplicates, best first, the namespace filter, every returned score against its row's exact score,
and the k-th score against the exact k-th score (tolerant of near-ties).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

from tiered_recall.hot import HotTier, start_sidecar

NS = [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 7]

CLIENT = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    from tiered_recall.hot import HotTier

    name, dim, n, seed, dtype, rounds, client = sys.argv[1:8]
    dim, n, seed, rounds, client = int(dim), int(n), int(seed), int(rounds), int(client)
    NS = np.array(json.loads(sys.argv[8]), dtype=np.uint64)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(n, dtype=np.int64) * 3 + 5
    ns = NS[rng.integers(0, len(NS), size=n)]
    stored = x.astype(np.float16).astype(np.float32) if dtype == "f16" else x
    tol = 3e-3 if dtype == "f16" else 1e-5
    row_of = {int(i): r for r, i in enumerate(ids)}
    hot = HotTier.attach(name, timeout_s=60)
    crng = np.random.default_rng([seed, client])
    bad = []
    checked = 0
    for rnd in range(rounds):
        k = [1, 10, 10, 64, 100][(rnd + client) % 5]
        nq = [1, 1, 3, 1, 20][(rnd * 7 + client) % 5]
        filt = int(NS[(rnd + client) % len(NS)]) if (rnd + client) % 3 == 0 else None
        q = crng.standard_normal((nq, dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        r = hot.search(q[0] if nq == 1 else q, k=k, namespace_hash=filt, touch=False)
        for i in range(nq):
            s = stored @ q[i]
            if filt is not None:
                s = np.where(ns == filt, s, -np.inf)
            top = np.sort(s)[::-1][:k]
            top = top[np.isfinite(top)]
            h = len(top)
            gi, gs = r.ids[i], r.scores[i]
            where = f"client {client} round {rnd} query {i} k {k} nq {nq} filter {filt is not None}"
            if int(np.sum(gi >= 0)) != h or r.hits != h:
                bad.append(f"{where}: hits {int(np.sum(gi >= 0))}/{r.hits}, want {h}")
                continue
            if not (np.all(gi[h:] == -1) and np.all(np.isneginf(gs[h:]))):
                bad.append(f"{where}: padding past the hits")
            if len(set(gi[:h].tolist())) != h:
                bad.append(f"{where}: duplicate ids")
            if np.any(np.diff(gs[:h]) > 0):
                bad.append(f"{where}: not best first")
            rows = np.array([row_of.get(int(v), -1) for v in gi[:h]])
            if np.any(rows < 0):
                bad.append(f"{where}: unknown ids")
                continue
            if filt is not None and np.any(ns[rows] != filt):
                bad.append(f"{where}: namespace filter broken")
            if not np.allclose(gs[:h], stored[rows] @ q[i], atol=tol, rtol=0):
                bad.append(f"{where}: scores do not match their rows")
            if h and abs(gs[h - 1] - top[h - 1]) > tol:
                bad.append(f"{where}: k-th score {gs[h - 1]} want {top[h - 1]}")
            if h and abs(gs[0] - top[0]) > tol:
                bad.append(f"{where}: best score {gs[0]} want {top[0]}")
            checked += 1
    hot.close()
    print(json.dumps({"checked": checked, "bad": bad[:20], "nbad": len(bad)}))
""")


def run_clients(name: str, *, dim: int, n: int, seed: int, dtype: str, clients: int, rounds: int) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, name, str(dim), str(n), str(seed), dtype, str(rounds),
                               str(c), json.dumps(NS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in range(clients)]
    failures = []
    total = 0
    for c, p in enumerate(procs):
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            failures.append(f"client {c} exited {p.returncode}: {err[-2000:]}")
            continue
        res = json.loads(out.strip().splitlines()[-1])
        total += res["checked"]
        if res["nbad"]:
            failures.append(f"client {c}: {res['nbad']} bad answers, e.g. {res['bad'][:5]}")
    assert not failures, "\n".join(failures)
    assert total > 0


def load(hot: HotTier, *, dim: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(n, dtype=np.int64) * 3 + 5
    ns = np.array(NS, dtype=np.uint64)[rng.integers(0, len(NS), size=n)]
    for s in range(0, n, 8192):
        hot.upsert(ids[s:s + 8192], x[s:s + 8192], ns[s:s + 8192])


@pytest.mark.parametrize("dim,n,dtype", [(96, 5000, "f32"), (256, 20_000, "f16")])
def test_concurrent_clients_cpu_batched(dim, n, dtype):
    """The server's batched path on the CPU backend (--test-batched-server)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    proc = start_sidecar(name, dim=dim, capacity=n, dtype=dtype, backend="cpu", test_batched_server=True)
    hot = HotTier.attach(name)
    try:
        load(hot, dim=dim, n=n, seed=11)
        run_clients(name, dim=dim, n=n, seed=11, dtype=dtype, clients=6, rounds=25)
        st = hot.stats()
        assert st.get("errors", 0) == 0
    finally:
        hot.close()
        proc.stop()


@pytest.mark.gpu
@pytest.mark.parametrize("dim,n", [(768, 100_000), (384, 30_011), (100, 5_000)])
def test_concurrent_clients_cuda(cuda_options, dim, n):
    """16 client processes against one CUDA sidecar: batched tensor-core passes (k = 100 rounds: the per-query
    kernel)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    proc = start_sidecar(name, dim=dim, capacity=n, dtype="f16", backend="cuda", **cuda_options)
    hot = HotTier.attach(name)
    try:
        load(hot, dim=dim, n=n, seed=5)
        run_clients(name, dim=dim, n=n, seed=5, dtype="f16", clients=16, rounds=30)
    finally:
        hot.close()
        proc.stop()


WRITER = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    from tiered_recall.hot import HotTier

    name, dim, n, seed, iters = sys.argv[1:6]
    dim, n, seed, iters = int(dim), int(n), int(seed), int(iters)
    NS = np.array(json.loads(sys.argv[6]), dtype=np.uint64)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(n, dtype=np.int64) * 3 + 5
    ns = NS[rng.integers(0, len(NS), size=n)]
    hot = HotTier.attach(name, timeout_s=60)
    wrng = np.random.default_rng(seed + 99)
    for it in range(iters):
        sel = np.sort(wrng.choice(n, size=64, replace=False))
        hot.upsert(ids[sel], x[sel], ns[sel])  # the same rows again: answers must not change
        hot.ping()
    hot.close()
    print("writer done")
""")


def run_with_writer(name: str, *, dim: int, n: int, seed: int, dtype: str, clients: int, rounds: int,
                    iters: int) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, name, str(dim), str(n), str(seed), str(iters),
                               json.dumps(NS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_clients(name, dim=dim, n=n, seed=seed, dtype=dtype, clients=clients, rounds=rounds)
    finally:
        out, err = writer.communicate(timeout=600)
    assert writer.returncode == 0, err[-2000:]


def test_searches_interleaved_with_writes_cpu_batched():
    """Searches gathered for a batch (or in flight) while upserts and pings arrive in the same ring
    pass: the upsert must not clobber the gathered queries, and every answer stays exact."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    dim, n = 64, 3000
    proc = start_sidecar(name, dim=dim, capacity=n, dtype="f32", backend="cpu", test_batched_server=True)
    hot = HotTier.attach(name)
    try:
        load(hot, dim=dim, n=n, seed=13)
        run_with_writer(name, dim=dim, n=n, seed=13, dtype="f32", clients=6, rounds=25, iters=150)
        assert hot.stats().get("errors", 0) == 0
    finally:
        hot.close()
        proc.stop()


@pytest.mark.gpu
def test_searches_interleaved_with_writes_cuda(cuda_options):
    """The pipelined CUDA path (a batch in flight while the next is gathered) with writes arriving:
    writes wait for the batch in flight, answers are written in place into the slots."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    dim, n = 768, 50_000
    proc = start_sidecar(name, dim=dim, capacity=n, dtype="f16", backend="cuda", **cuda_options)
    hot = HotTier.attach(name)
    try:
        load(hot, dim=dim, n=n, seed=17)
        run_with_writer(name, dim=dim, n=n, seed=17, dtype="f16", clients=12, rounds=30, iters=200)
        assert hot.stats().get("errors", 0) == 0
    finally:
        hot.close()
        proc.stop()


@pytest.mark.gpu
def test_cuda_without_zero_copy(cuda_options):
    """--test-no-zero-copy (the segment left unregistered, as where registration fails): results go through the
    pinned buffer and are copied into the slots."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    dim, n = 384, 20_000
    proc = start_sidecar(name, dim=dim, capacity=n, dtype="f16", backend="cuda", test_no_zero_copy=True,
                         **cuda_options)
    hot = HotTier.attach(name)
    try:
        load(hot, dim=dim, n=n, seed=19)
        run_clients(name, dim=dim, n=n, seed=19, dtype="f16", clients=8, rounds=20)
    finally:
        hot.close()
        proc.stop()
