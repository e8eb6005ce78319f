"""Random interleavings of several processes over one store, each search checked against exact search.

A seeded driver keeps a model of every memory (id -> namespace, vector, role, text) and sends one operation at a
time to one of a few worker processes, each with its own TieredMemory on the same store and its own device
(none, cpu, cuda), a small hot capacity (so rows are evicted and promoted) and its own policy: adds (half of them
with ids the store draws), upserts of existing ids (new vector, sometimes another namespace), deletes, reopening
the store, SIGKILL of the store's sidecar, and searches with and without namespace, where and hybrid. Every search
that did not opt into the approximate confidence rule is compared with exact search over the model (hybrid ones:
with the cold tier's own fused ranking, read by the driver's read-only store); a mismatch stops the run with the
seed and the operation log.

tests/coordinator/test_interleavings.py runs it in CI; benchmarks/interleavings.py runs it long.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DIM = 16
NAMESPACES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
TARGET_ROWS = 64  # past this many memories adds turn rarer than deletes: namespaces stay small enough to be kept
# whole by a hot tier of a few dozen rows (rule 1), and large enough to be evicted in part
SAME_WORKER = 0.6  # the chance that an operation goes to the worker of the one before (runs of one process's calls)
ROLES = ("user", "assistant")
WORDS = ("boat", "tour", "slides", "paint", "colour", "allergy", "garden", "train", "ticket", "dinner", "music",
         "review", "budget", "invoice", "coffee")
F32_TOL = 1e-5
F16_TOL = 2e-3  # a CUDA hot tier keeps f16 rows


def word_vectors(texts: list[str]) -> np.ndarray:
    """The workers' embedder (hybrid searches embed their query text): each word a fixed random direction, a text
    the normalised sum of its words' (the driver embeds the same way to check)."""
    out = np.zeros((len(texts), DIM), np.float32)
    for row, text in enumerate(texts):
        for word in text.split():
            seed = int.from_bytes(word.encode()[:8].ljust(8, b"\0"), "little")
            out[row] += np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
        if not out[row].any():
            out[row, 0] = 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@dataclass
class Mix:
    """Relative weights of the operations."""

    add: float = 30
    upsert: float = 10
    delete: float = 10
    search: float = 45
    reopen: float = 2
    kill_sidecar: float = 0.5  # each kill leaves the workers a second without a hot tier (their reconnect backoff)


@dataclass
class Row:
    """What the driver's model knows of one memory."""

    namespace: str
    vector: np.ndarray
    role: str
    text: str


@dataclass
class Failure(AssertionError):
    """A wrong answer: the seed, the operation it came at, what was wrong and the operation log (str() says how to
    re-run it)."""

    seed: int
    step: int
    what: str
    log: list = field(default_factory=list)

    def __str__(self) -> str:
        tail = "\n".join(json.dumps(entry) for entry in self.log[-40:])
        return (f"interleaving seed {self.seed}, operation {self.step}: {self.what}\n"
                f"re-run: python benchmarks/interleavings.py --seed {self.seed} --ops {self.step + 1}\n"
                f"last operations:\n{tail}")


# ---- the worker: one process, one TieredMemory, commands on stdin, answers on stdout ----------------------------

def _worker(path: str, device: str, hot_capacity: int, policy: str) -> None:
    from tiered_recall import TieredMemory

    from tiered_recall.embedders import CallableEmbedder

    embedder = CallableEmbedder(word_vectors, dim=DIM, name="interleavings:words")

    def open_store():
        return TieredMemory(path, dim=DIM, embedder=embedder, device=device, hot_capacity=hot_capacity,
                            policy=policy, orphan_grace_s=2.0, timeout_s=5.0)

    memory = open_store()
    out = sys.stdout
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "add":
                ids = memory.add(cmd["texts"], vectors=np.asarray(cmd["vectors"], np.float32),
                                 namespace=cmd["namespace"], ids=cmd["ids"], role=cmd["roles"])
                answer: Any = ids
            elif op == "delete":
                answer = memory.delete(cmd["ids"])
            elif op == "search":
                query = cmd.get("text") or np.asarray(cmd["vector"], np.float32)
                report = memory.search(query, k=cmd["k"], namespace=cmd["namespace"], where=cmd["where"],
                                       hybrid=cmd["hybrid"], explain=True)
                answer = {"hits": [[h.id, h.score, h.tier] for h in report.hits], "rule": report.rule}
            elif op == "reopen":
                memory.close()
                memory = open_store()
                answer = None
            elif op == "stop":
                memory.close()
                out.write(json.dumps({"ok": None}) + "\n")
                out.flush()
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            out.write(json.dumps({"ok": answer}) + "\n")
        except Exception as exc:  # reported to the driver, which fails the run with the log
            out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()


class Worker:
    """One worker process (this module run with --worker) with its own TieredMemory on the store, driven over
    its stdin and stdout."""

    def __init__(self, index: int, path: Path, device: str, hot_capacity: int, policy: str) -> None:
        self.index, self.device, self.policy = index, device, policy
        args = [sys.executable, "-m", "tiered_recall.testing.interleavings", "--worker", str(path), device,
                str(hot_capacity), policy]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def call(self, cmd: dict, timeout_s: float = 120.0) -> Any:
        """Sends one command and returns the worker's answer; RuntimeError when it died or the operation raised."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.index} ({self.device}) died (exit {self.proc.poll()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"worker {self.index} ({self.device}): {reply['error']}")
        return reply["ok"]

    def stop(self) -> None:
        """Asks the worker to close its store and exit (killed after 30 s), and closes its pipes."""
        try:
            self.call({"op": "stop"})
        except Exception:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


# ---- the driver --------------------------------------------------------------------------------------------------

def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _text(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(2, 6))).tolist())


def check_hits(got: list, model: dict[int, Row], q: np.ndarray, k: int, namespace: str | None, role: str | None,
               tol: float) -> str | None:
    """None when `got` is exact search over the model, ties (within tol) aside; else what is wrong."""
    rows = [(i, r) for i, r in model.items()
            if (namespace is None or r.namespace == namespace) and (role is None or r.role == role)]
    if len(got) != min(k, len(rows)):
        return f"{len(got)} hits, expected {min(k, len(rows))}"
    if not rows:
        return None
    ids = np.array([i for i, _ in rows], np.int64)
    scores = np.stack([r.vector for _, r in rows]) @ q
    order = np.lexsort((ids, -scores))[:k]
    kth = float(scores[order[-1]])
    truth = dict(zip(ids.tolist(), scores.tolist()))
    got_ids = [int(h[0]) for h in got]
    if len(set(got_ids)) != len(got_ids):
        return f"an id came back twice: {got_ids}"
    for i, score, _tier in got:
        if int(i) not in truth:
            return f"id {i} is not a live row of the scope (deleted, or of another namespace/role)"
        if abs(float(score) - truth[int(i)]) > tol:
            return f"id {i} scored {score:.6f}, its stored vector gives {truth[int(i)]:.6f} (a stale copy?)"
        if truth[int(i)] < kth - 2 * tol:
            return f"id {i} ({truth[int(i)]:.6f}) is below the true k-th score {kth:.6f}"
    missing = [int(ids[j]) for j in order if scores[j] > kth + 2 * tol and int(ids[j]) not in got_ids]
    if missing:
        return f"ids {missing} belong in the top {k} and are missing"
    return None


@dataclass
class Result:
    """What a run did: operations by kind (counts), searches by the rule that answered (rules), its time and the
    device of each worker."""

    seed: int
    ops: int
    counts: dict
    rules: dict
    seconds: float
    devices: list


def run(path: Path, *, seed: int, ops: int, workers: int = 3, devices: tuple[str, ...] = ("none", "cpu"),
        hot_capacity: int = 40, mix: Mix | None = None, progress=None) -> Result:
    """One seeded interleaving of `ops` operations over a new store at `path`; raises Failure on a wrong answer."""
    from tiered_recall.coordinator.link import sidecar_name_of
    from tiered_recall.hot import segment_path
    from tiered_recall.storage import ColdStore

    mix = mix or Mix()
    rng = np.random.default_rng(seed)
    path = Path(path)
    names = ("add", "upsert", "delete", "search", "reopen", "kill_sidecar")
    base = np.array([getattr(mix, n) for n in names], float)
    # the devices in turn from a drawn start, so each is held by about as many workers as the others
    # (CUDA first when asked for: the first worker starts the store's sidecar, and a CUDA one is the point then)
    start = devices.index("cuda") if "cuda" in devices else int(rng.integers(len(devices)))
    drawn = [devices[(start + i) % len(devices)] for i in range(workers)]
    # "namespace" keeps whole namespaces hot, so rule 1 answers often; the others promote hits one by one
    policies = [str(rng.choice(["namespace", "namespace", "lru", "lfu"])) for _ in range(workers)]
    tol = F16_TOL if "cuda" in drawn else F32_TOL
    model: dict[int, Row] = {}
    log: list = []
    counts = {n: 0 for n in names}
    rules: dict[str, int] = {}
    next_id = 1
    started = time.monotonic()
    # the first worker creates the store; the others open it once it exists
    pool = [Worker(0, path, drawn[0], hot_capacity, policies[0])]
    pool[0].call({"op": "delete", "ids": [0]})  # a round trip: the store exists now
    pool += [Worker(i, path, drawn[i], hot_capacity, policies[i]) for i in range(1, workers)]
    reference: ColdStore | None = None
    segment = segment_path(sidecar_name_of(path))
    try:
        w = pool[0]
        for step in range(ops):
            weights = base.copy()
            if len(model) > TARGET_ROWS:
                weights[names.index("add")] *= 0.25
            op = str(rng.choice(names, p=weights / weights.sum()))
            if rng.random() >= SAME_WORKER:
                w = pool[int(rng.integers(len(pool)))]
            entry: dict = {"step": step, "op": op, "worker": w.index, "device": w.device}
            if op in ("upsert", "delete") and not model:
                op = entry["op"] = "add"
            if op == "add":
                n = int(rng.integers(1, 4))
                ns = str(rng.choice(NAMESPACES))
                # Half the adds let the store draw the ids (its own path: ids no other write holds).
                ids = None if rng.random() < 0.5 else list(range(next_id, next_id + n))
                next_id += n
                vecs = [_unit(rng) for _ in range(n)]
                roles = [str(rng.choice(ROLES)) for _ in range(n)]
                texts = [_text(rng) for _ in range(n)]
                entry.update(namespace=ns, ids=ids)
                log.append(entry)
                ids = w.call({"op": "add", "ids": ids, "namespace": ns, "vectors": [v.tolist() for v in vecs],
                              "roles": roles, "texts": texts})
                entry["ids"] = ids
                for i, v, r, t in zip(ids, vecs, roles, texts):
                    model[i] = Row(ns, v, r, t)
            elif op == "upsert":
                i = int(rng.choice(sorted(model)))
                ns = str(rng.choice(NAMESPACES)) if rng.random() < 0.3 else model[i].namespace
                v, r, t = _unit(rng), str(rng.choice(ROLES)), _text(rng)
                entry.update(id=i, namespace=ns)
                log.append(entry)
                w.call({"op": "add", "ids": [i], "namespace": ns, "vectors": [v.tolist()], "roles": [r],
                        "texts": [t]})
                model[i] = Row(ns, v, r, t)
            elif op == "delete":
                pick = rng.choice(sorted(model), size=min(len(model), int(rng.integers(1, 3))), replace=False)
                ids = [int(i) for i in pick] + ([next_id + 10_000] if rng.random() < 0.2 else [])
                entry.update(ids=ids)
                log.append(entry)
                deleted = w.call({"op": "delete", "ids": ids})
                expected = sum(1 for i in ids if i in model)
                if deleted != expected:
                    raise Failure(seed, step, f"delete said {deleted} rows, {expected} existed", log)
                for i in ids:
                    model.pop(i, None)
            elif op == "search":
                k = int(rng.integers(1, 11))
                ns = str(rng.choice(NAMESPACES)) if rng.random() < 0.75 else None
                role = str(rng.choice(ROLES)) if rng.random() < 0.15 else None
                hybrid = role is None and rng.random() < 0.1
                text = _text(rng) if hybrid else None
                q = word_vectors([text])[0] if hybrid else _unit(rng)
                entry.update(k=k, namespace=ns, where=role, hybrid=hybrid)
                log.append(entry)
                answer = w.call({"op": "search", "vector": q.tolist(), "text": text, "k": k, "namespace": ns,
                                 "where": None if role is None else f"role = '{role}'", "hybrid": hybrid})
                rules[answer["rule"]] = rules.get(answer["rule"], 0) + 1
                entry["rule"] = answer["rule"]
                if hybrid:
                    if reference is None:
                        reference = ColdStore(path / "cold", dim=DIM, read_only=True)
                    problem = _check_hybrid(answer["hits"], reference, q, text, k, ns, model)
                else:
                    problem = check_hits(answer["hits"], model, q, k, ns, role, tol)
                if problem:
                    entry["hits"] = answer["hits"]
                    raise Failure(seed, step, f"search ({answer['rule']}): {problem}", log)
            elif op == "reopen":
                log.append(entry)
                w.call({"op": "reopen"})
            elif op == "kill_sidecar":
                log.append(entry)
                entry["killed"] = _kill_sidecar(segment)
            counts[op] += 1
            if progress is not None:
                progress(step + 1)
    finally:
        for w in pool:
            w.stop()
        if reference is not None:
            reference.close()
        _kill_sidecar(segment, sig=signal.SIGTERM)
    return Result(seed, ops, counts, rules, time.monotonic() - started, drawn)


def _check_hybrid(got: list, reference, q: np.ndarray, text: str, k: int, namespace: str | None,
                  model: dict[int, Row]) -> str | None:
    """Hybrid answers come from the cold tier: the same fused ranking as the driver's own read of it, over live
    rows only, each with its exact cosine score."""
    ids, _ = reference.search(q, k=k, namespace=namespace, text=text)
    got_ids = [int(h[0]) for h in got]
    if got_ids != [int(i) for i in ids]:
        return f"hybrid ids {got_ids}, the cold tier ranks {ids.tolist()}"
    for i, score, _tier in got:
        row = model.get(int(i))
        if row is None or (namespace is not None and row.namespace != namespace):
            return f"hybrid id {i} is not a live row of the scope"
        if abs(float(score) - float(row.vector @ q)) > F32_TOL:
            return f"hybrid id {i} scored {score}, its vector gives {float(row.vector @ q)}"
    return None


def _kill_sidecar(segment: Path, sig: int = signal.SIGKILL) -> int:
    """Signals the sidecar that owns `segment` (SIGKILL leaves the segment behind, to be reclaimed); its pid or 0."""
    from tiered_recall.hot import layout as L

    try:
        raw = segment.read_bytes()[: L.HEADER_BYTES]
    except OSError:
        return 0
    if len(raw) < L.HEADER_BYTES:
        return 0
    pid = int(L.Header.from_buffer_copy(raw).owner_pid)
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return 0
    from tiered_recall.hot.proc import pid_alive

    deadline = time.monotonic() + 5
    while sig == signal.SIGKILL and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit("usage: python -m tiered_recall.testing.interleavings --worker PATH DEVICE HOT_CAPACITY POLICY")
