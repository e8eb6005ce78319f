"""Fault injection engines (SIGKILL of the sidecar under load, clients killed mid-request, ingest runs killed,
a full disk): tests/coordinator/test_faults.py runs them small in CI, benchmarks/faults.py long. Each returns a dict of figures."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

DIM = 32
HANG_S = 20.0  # a call slower than this counts as hung (the client timeout is 2 s; cold search is ms)


def _unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _open(store: Path, device: str = "cpu"):
    from tiered_recall import TieredMemory

    return TieredMemory(store, dim=DIM, embedder=None, device=device, hot_capacity=200_000, timeout_s=2.0,
                        orphan_grace_s=2.0)


def sidecar_pid(name: str) -> int:
    """The pid of the live sidecar serving segment `name`, or 0 when none is ready there."""
    from tiered_recall.hot import layout as L
    from tiered_recall.hot.proc import pid_alive
    from tiered_recall.hot import segment_path

    try:
        raw = segment_path(name).read_bytes()[: L.HEADER_BYTES]
    except OSError:
        return 0
    if len(raw) < L.HEADER_BYTES:
        return 0
    head = L.Header.from_buffer_copy(raw)
    return int(head.owner_pid) if head.state == L.SERVER_READY and pid_alive(int(head.owner_pid)) else 0


# ---- 1. SIGKILL the sidecar while clients add and search -------------------------------------

def _load_worker(store: str, worker: int, stop, queue) -> None:
    from tiered_recall.errors import TieredRecallError

    rng = np.random.default_rng(worker + 17)
    namespace = f"w{worker}"
    acked: list[int] = []
    vectors: dict[int, np.ndarray] = {}
    stats = dict(worker=worker, adds=0, searches=0, clear_errors=0, wrong=0, hung=0, unexpected=[], max_call_s=0.0,
                 tiers={}, wrong_examples=[])
    try:
        memory = _open(Path(store))
        while not stop.is_set():
            for op in ("add", "search", "search"):
                t0 = time.monotonic()
                try:
                    if op == "add":
                        v = _unit(rng, 1)
                        memory_id = memory.add(vectors=v, namespace=namespace)[0]
                        acked.append(memory_id)  # acknowledged: must survive everything below
                        vectors[memory_id] = v[0]
                        stats["adds"] += 1
                    elif acked:
                        target = acked[int(rng.integers(len(acked)))]
                        hits = memory.search(vectors[target], k=3, namespace=namespace)
                        stats["searches"] += 1
                        if not hits or hits[0].id != target or abs(hits[0].score - 1.0) > 1e-4:
                            stats["wrong"] += 1
                            if len(stats["wrong_examples"]) < 3:  # what a wrong answer looked like
                                stats["wrong_examples"].append({"target": target, "acked_before": len(acked),
                                                                "hits": [(h.id, round(h.score, 5), h.tier) for h in hits]})
                        for h in hits:
                            stats["tiers"][h.tier] = stats["tiers"].get(h.tier, 0) + 1
                except TieredRecallError:
                    stats["clear_errors"] += 1  # allowed: a clear error within the timeout
                except Exception as exc:  # an unclear failure is a bug
                    stats["unexpected"].append(repr(exc)[:300])
                took = time.monotonic() - t0
                stats["max_call_s"] = max(stats["max_call_s"], took)
                if took > HANG_S:
                    stats["hung"] += 1
        memory.search(_unit(rng, 1)[0], k=1)  # reconnects and flushes this worker's backlog
        memory.close()
    except Exception as exc:
        stats["unexpected"].append(f"worker died: {exc!r}"[:300])
    stats["acked"] = acked
    queue.put(stats)


def sidecar_kills(store: Path, *, kills: int, workers: int = 4, min_gap_s: float = 0.3, max_gap_s: float = 1.5,
                  seed: int = 0) -> dict:
    """Runs `workers` processes adding and searching; SIGKILLs the sidecar `kills` times at random moments."""
    from tiered_recall.hot import HotTier

    rnd = random.Random(seed)
    memory = _open(store)
    name = memory.sidecar_name
    memory.close()
    ctx = mp.get_context("spawn")
    stop, queue = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_load_worker, args=(str(store), w, stop, queue)) for w in range(workers)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # let the workers import and open the store
    done, restart_s, waits_without_sidecar = 0, [], 0
    t_start = time.monotonic()
    while done < kills:
        time.sleep(rnd.uniform(min_gap_s, max_gap_s))
        pid = sidecar_pid(name)
        if not pid:
            waits_without_sidecar += 1
            if waits_without_sidecar > 60:
                break  # nobody restarted it: reported below as a failure
            continue
        waits_without_sidecar = 0
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        done += 1
        while time.monotonic() - t_kill < 30:  # restarted by a client, without a person acting
            new = sidecar_pid(name)
            if new and new != pid:
                restart_s.append(time.monotonic() - t_kill)
                break
            time.sleep(0.01)
    stop.set()
    results = []
    for p in procs:
        try:
            results.append(queue.get(timeout=HANG_S + 60))
        except Exception:
            pass
    hung_workers = 0
    for p in procs:
        p.join(30)
        if p.is_alive():
            hung_workers += 1
            p.kill()
    elapsed = time.monotonic() - t_start
    acked = [i for r in results for i in r["acked"]]
    final = _open(store)
    try:
        rows = final.get(acked) if acked else []
        lost = sum(1 for r in rows if r is None)
        total = final.count()
        hot = HotTier.attach(final.sidecar_name)
        deadline = time.monotonic() + 10
        while True:
            present = int(hot.contains(np.asarray(acked, dtype=np.int64)).sum()) if acked else 0
            if present == len(acked) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # once the hot tier holds every acknowledged row, a search must be served from it: the second one, since adds
        # whose hot side failed while the sidecar was down left certificates stale, and the first search's cold
        # path repairs them (docs/skip-rules.md)
        query = final.cold.get([acked[-1]])[0]["vector"] if acked else None
        if query is not None:
            final.search(query, k=1)
        hits = final.search(query, k=1) if acked else []
        final_tier = hits[0].tier if hits else None
        hot_rows = hot.stats()["hot_rows"]
        hot.close()
    finally:
        final.close()
    return {
        "test": "sidecar-kills", "workers": workers, "kills": done, "kills_asked": kills,
        "restarted_every_time": len(restart_s) == done, "restart_s_median": float(np.median(restart_s)) if restart_s else None,
        "restart_s_max": max(restart_s) if restart_s else None, "seconds": round(elapsed, 1),
        "adds_acknowledged": len(acked), "acknowledged_lost": lost, "rows_in_store": total,
        "duplicates": total - len(set(acked)), "searches": sum(r["searches"] for r in results),
        "wrong_answers": sum(r["wrong"] for r in results), "clear_errors": sum(r["clear_errors"] for r in results),
        "wrong_examples": [e for r in results for e in r["wrong_examples"]][:5],
        "hung_calls": sum(r["hung"] for r in results) + hung_workers, "workers_reported": len(results),
        "max_call_s": round(max((r["max_call_s"] for r in results), default=0.0), 3),
        "unexpected": [u for r in results for u in r["unexpected"]][:10],
        "tiers_served": {t: sum(r["tiers"].get(t, 0) for r in results) for t in ("hot", "cold")},
        "hot_rows_after": hot_rows, "acked_in_hot_after": present, "final_search_tier": final_tier,
    }


# ---- 2. SIGKILL a client in the middle of a request ------------------------------------------

def _busy_client(name: str, seed: int, ready) -> None:
    from tiered_recall.hot import HotTier

    rng = np.random.default_rng(seed)
    hot = HotTier.attach(name, timeout_s=10)
    x = _unit(rng, hot.max_upsert_rows * 3, hot.dim)
    ids = np.arange(x.shape[0], dtype=np.int64) + (1 << 40) + seed * 100_000
    ready.set()
    while True:  # every call holds a slot; a SIGKILL lands in one of them
        hot.upsert(ids, x, 77)
        hot.search(x[: hot.max_search_queries // 2], k=hot.max_k // 4)
        hot.delete(ids[::2])


def client_kills(*, kills: int, dim: int = 256, slots: int = 2, seed: int = 0, timeout_s: float = 120) -> dict:
    """A client doing large requests is SIGKILLed `kills` times; another client checks its answers all along."""
    import uuid

    from tiered_recall.hot import layout as L
    from tiered_recall.hot import HotTier, start_sidecar

    name = f"faults-{uuid.uuid4().hex[:10]}"
    proc = start_sidecar(name, dim=dim, capacity=50_000, slots=slots)
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    honest = HotTier.attach(name, timeout_s=10)
    mine = _unit(rng, 8, dim)
    my_ids = np.arange(8, dtype=np.int64) + (1 << 50)
    honest.upsert(my_ids, mine, 5)
    checks = wrong = errors = 0
    stop = threading.Event()

    def check_loop() -> None:
        nonlocal checks, wrong, errors
        while not stop.is_set():
            i = checks % 8
            try:
                honest.upsert(my_ids[i: i + 1], mine[i: i + 1], 5)
                res = honest.search(mine[i], k=1, namespace_hash=5)
                if res.ids[0, 0] != my_ids[i]:
                    wrong += 1
            except Exception:
                errors += 1
            checks += 1

    checker = threading.Thread(target=check_loop, daemon=True)
    checker.start()
    ctx = mp.get_context("spawn")
    t0 = time.monotonic()
    killed = 0
    for k in range(kills):
        ready = ctx.Event()
        p = ctx.Process(target=_busy_client, args=(name, seed * 1000 + k, ready))
        p.start()
        if not ready.wait(60):
            p.kill()
            break
        time.sleep(rnd.uniform(0.02, 0.4))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        killed += 1
        if time.monotonic() - t0 > timeout_s:
            break
    stop.set()
    checker.join(30)
    # every slot comes back: the dead clients' ones are reclaimed by the sidecar's sweep
    deadline = time.monotonic() + 5
    while True:
        states = [L.Slot.from_buffer_copy(honest._mm[honest._header.slots_offset + i * honest._header.slot_bytes:
                                                      honest._header.slots_offset + i * honest._header.slot_bytes
                                                      + L.SLOT_HEADER_BYTES]).state for i in range(slots)]
        if all(s == L.SLOT_FREE for s in states) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    t1 = time.monotonic()
    ok_after = honest.search(mine[3], k=1, namespace_hash=5).ids[0, 0] == my_ids[3]
    ping_after_s = time.monotonic() - t1
    reclaimed = honest.stats()["reclaimed_slots"]
    honest.close()
    alive = proc.running()
    proc.stop()
    return {"test": "client-kills", "kills": killed, "slots": slots, "honest_checks": checks, "honest_wrong": wrong,
            "honest_errors": errors, "slots_free_after": all(s == L.SLOT_FREE for s in states),
            "reclaimed_slots": reclaimed, "sidecar_alive": alive, "honest_ok_after": bool(ok_after),
            "call_after_s": round(ping_after_s, 3), "seconds": round(time.monotonic() - t0, 1)}


# ---- 3. SIGKILL an ingest run and run it again -----------------------------------------------

def write_conversations(path: Path, turns: int, seed: int = 0) -> Path:
    """Writes `turns` JSON Lines chat turns (50 a session, one a minute, seeded) to path; returns path."""
    rnd = random.Random(seed)
    words = "apple river mountain coffee train doctor garden holiday budget slides vet allergy concert".split()
    with open(path, "w") as f:
        for t in range(turns):
            text = " ".join(rnd.choice(words) for _ in range(8)) + f" #{t}"
            f.write(json.dumps({"session": f"s{t // 50}", "role": "user" if t % 2 else "assistant",
                                "content": text, "timestamp": 1_700_000_000 + t * 60}) + "\n")
    return path


def _ingest_cmd(data: Path, store: Path, batch: int) -> list[str]:
    # the installed console script: `python -m` from a checkout would import the source tree
    return [str(Path(sys.executable).parent / "tiered-recall"), "ingest", str(data), "--store", str(store), "--device", "none",
            "--batch-size", str(batch), "--quiet", "--json", "--namespace", "chat-{conversation}"]


def _snapshot(store: Path) -> dict[int, tuple]:
    from tiered_recall import TieredMemory

    with TieredMemory(store, device="none", embedder=None) as m:  # no model load: only rows are read
        table = m.cold._tables.table.to_arrow() if hasattr(m.cold, "_tables") else None
        if table is None:
            raise RuntimeError("cannot read the cold table")
        ids = table.column("id").to_pylist()
        texts = table.column("text").to_pylist()
        nss = table.column("namespace").to_pylist()
    return {i: (t, n) for i, t, n in zip(ids, texts, nss)}, len(ids)


def _table_rows(store: Path) -> int:
    """Rows committed in a store's LanceDB table right now (0 when the table does not exist yet). Rows still in a
    write-ahead log (a cold tier that logs small adds) are not counted: opening the store would replay them, and
    the re-run after a kill must be the process that does that."""
    import lancedb

    from tiered_recall.storage import TABLE_NAME

    try:
        return int(lancedb.connect(str(store / "cold")).open_table(TABLE_NAME).count_rows())
    except Exception:
        return 0


def _table_created(store: Path) -> bool:
    """The ingest has opened its store: the cold table's first version is on disk (the embedder is loaded
    before the table is opened, so from here on the process is ingesting)."""
    versions = store / "cold" / "memories.lance" / "_versions"
    try:
        return any(versions.iterdir())
    except OSError:
        return False


def _timed_ingest(data: Path, store: Path, batch: int) -> tuple[float, float, float, str]:
    """A clean ingest: (seconds until its table existed, seconds to exit, its own ingest seconds, stdout)."""
    t0 = time.monotonic()
    p = subprocess.Popen(_ingest_cmd(data, store, batch), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    opened = None
    while p.poll() is None:
        if opened is None and _table_created(store):
            opened = time.monotonic() - t0
        time.sleep(0.002)
    out, err = p.communicate()
    total = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"clean ingest failed: {err[-2000:]}")
    try:  # the pipeline's own time (reading, embedding, committing), printed by --json
        ingest_s = float(json.loads(out[out.index("{"):])["elapsed_s"])
    except (ValueError, KeyError):
        ingest_s = total - (opened or 0.0)
    return (opened if opened is not None else 0.0), total, ingest_s, out


def ingest_kills(workdir: Path, *, kills: int, turns: int = 600, batch: int = 25, seed: int = 0) -> dict:
    """SIGKILL ingest runs at random moments inside the ingest, re-run, compare with one clean run.

    A clean run is timed first: from its start until its store's table exists (start-up and embedder load),
    and the pipeline's own ingest time T. Each kill is an independent trial on a fresh store: start the same
    ingest, wait until its table exists, SIGKILL it after a delay drawn uniformly from [0, T), count the rows
    its table held, run it again to completion and compare the store with the clean run's (ids, texts,
    namespaces: missing, extra, duplicate rows). A kill lands when the process was still running; the rows in
    the table at the kill show where it landed (fewer than a clean run's: before the run's last rows reached
    the table)."""
    rnd = random.Random(seed)
    data = write_conversations(workdir / "chat.jsonl", turns, seed)
    clean = workdir / "clean"
    opened_s, clean_s, ingest_s, _ = _timed_ingest(data, clean, batch)
    want, want_rows = _snapshot(clean)
    trials = []
    for j in range(kills):
        dirty = workdir / f"dirty{j}"
        delay = rnd.uniform(0.0, ingest_s)
        p = subprocess.Popen(_ingest_cmd(data, dirty, batch), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while p.poll() is None and not _table_created(dirty) and time.monotonic() - t0 < 600:
            time.sleep(0.002)
        t_open = time.monotonic()
        landed, killed_at = False, None
        try:
            p.wait(delay)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            killed_at = time.monotonic() - t_open
            p.wait()
            landed = True
        at_kill = _table_rows(dirty)
        rerun = subprocess.run(_ingest_cmd(data, dirty, batch), capture_output=True, text=True, timeout=900)
        if rerun.returncode != 0:
            raise RuntimeError(f"re-run after a kill failed: {rerun.stderr[-2000:]}")
        got, got_rows = _snapshot(dirty)
        trials.append({"delay_s": round(delay, 3), "landed": landed, "killed_at_s": None if killed_at is None else round(killed_at, 3), "rows_at_kill": at_kill, "rows_after_rerun": got_rows,
                       "missing": len(set(want) - set(got)), "extra": len(set(got) - set(want)),
                       "duplicates": got_rows - len(got), "different_text": sum(1 for i in want if i in got and got[i] != want[i]),
                       "identical": got == want and got_rows == want_rows})
        shutil.rmtree(dirty, ignore_errors=True)
    landed = [t for t in trials if t["landed"]]
    return {"test": "ingest-kills", "turns": turns, "batch": batch, "kills_tried": kills, "kills": len(landed),
            "kills_before_all_rows_in_table": sum(1 for t in landed if t["rows_at_kill"] < want_rows),
            "kills_with_no_rows_in_table": sum(1 for t in landed if t["rows_at_kill"] == 0),
            "clean_run_s": round(clean_s, 2), "clean_open_s": round(opened_s, 2), "clean_ingest_s": round(ingest_s, 2),
            "clean_rows": want_rows, "rows_at_kill": [t["rows_at_kill"] for t in trials],
            "missing": sum(t["missing"] for t in trials), "extra": sum(t["extra"] for t in trials),
            "duplicates": sum(t["duplicates"] for t in trials), "different_text": sum(t["different_text"] for t in trials),
            "identical": all(t["identical"] for t in trials), "trials": trials}


# ---- 4. fill the disk during adds --------------------------------------------------------------

def disk_full(mount_point: Path, *, size: str = "4m", text_bytes: int = 4000) -> dict:
    """Mounts a small tmpfs (root only), adds until the disk is full, reopens, checks every acknowledged memory."""
    from tiered_recall.errors import TieredRecallError

    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount_point)], check=True,
                   capture_output=True)
    try:
        store = mount_point / "store"
        rng = np.random.default_rng(0)
        acked: list[int] = []
        error = None
        memory = _open(store, device="none")
        t0 = time.monotonic()
        for batch in range(10_000):
            texts = [f"memory {batch}-{i} " + "x" * text_bytes for i in range(20)]
            try:
                acked += memory.add(texts, vectors=_unit(rng, 20))
            except TieredRecallError as exc:
                error = exc
                break
            except Exception as exc:  # an unclear error is the failure this test looks for
                error = exc
                break
            if time.monotonic() - t0 > 120:
                break
        after_error_ok = None
        try:
            memory.close()
        except Exception:
            pass
        reopened = _open(store, device="none")
        try:
            rows = reopened.get(acked) if acked else []
            lost = sum(1 for r in rows if r is None)
            count = reopened.count()
        finally:
            reopened.close()
        return {"test": "disk-full", "size": size, "acknowledged": len(acked), "acknowledged_lost": lost,
                "rows_after_reopen": count, "error_type": type(error).__name__ if error else None,
                "error": str(error)[:300] if error else None,
                "clear_error": isinstance(error, TieredRecallError), "after_error_ok": after_error_ok}
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
