"""Hostile-client fuzzing of the request ring against a sidecar built with ASan + UBSan (issue 8, part 2).

The short CI version: build the sidecar with -DTR_SANITIZE=ON and the fuzz driver
(native/tools/fuzz_client.c, -DTR_BUILD_FUZZ=ON) once per session, fire a few hundred thousand
random and boundary requests at it while honest clients search beside it, then scribble over the
header's geometry. Zero sanitizer reports, the sidecar alive, every honest answer correct.
The long version is benchmarks/fuzz_sidecar.py.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tiered_recall import _layout as L
from tiered_recall.sidecar import HotTier, segment_path

NATIVE = Path(__file__).resolve().parents[1] / "native"
SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:",
                     "SUMMARY: ")
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=0",
}


def build_sanitized(build_dir: Path) -> Path:
    """cmake -DTR_SANITIZE=ON -DTR_BUILD_FUZZ=ON into build_dir; returns it (holds tr-sidecar, tr-fuzz-client)."""
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(NATIVE), "-B", str(build_dir), *gen, "-DTR_CUDA=OFF", "-DTR_SANITIZE=ON",
                    "-DTR_BUILD_FUZZ=ON", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                   check=True, capture_output=True, text=True, timeout=300)
    subprocess.run(["cmake", "--build", str(build_dir), "--parallel", "2"], check=True, capture_output=True,
                   text=True, timeout=600)
    return build_dir


class SanitizedSidecar:
    """An ASan/UBSan tr-sidecar started by hand (its log is kept, the segment removed afterwards)."""

    def __init__(self, build_dir: Path, name: str, log_path: Path, *, dim: int, capacity: int, slots: int) -> None:
        self.name = name
        self.log_path = log_path
        env = {**os.environ, **SANITIZER_ENV}
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(
            [str(build_dir / "tr-sidecar"), "--name", name, "--dim", str(dim), "--capacity", str(capacity),
             "--slots", str(slots), "--verbose"], stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, env=env)
        deadline = time.monotonic() + 30
        path = segment_path(name)
        while True:
            assert self.popen.poll() is None, f"sanitized sidecar died at start: {self.log()}"
            try:
                raw = path.read_bytes()[: L.HEADER_BYTES]
                if len(raw) == L.HEADER_BYTES:
                    head = L.Header.from_buffer_copy(raw)
                    if head.owner_pid == self.popen.pid and head.state == L.SERVER_READY:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "sanitized sidecar did not become ready"
            time.sleep(0.01)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM (LeakSanitizer runs at exit); returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        path = segment_path(self.name)
        if path.exists():
            path.unlink()
        return int(self.popen.returncode)


def sanitizer_reports(log: str) -> list[str]:
    return [line for line in log.splitlines() if any(m in line for m in SANITIZER_MARKERS)]


def honest_client(name: str, worker: int, seconds: float, queue, stop=None) -> None:
    """Upserts its own rows in its own namespace and checks every search answer it gets, for
    `seconds` or until the `stop` event (multiprocessing.Event) is set."""
    try:
        rng = np.random.default_rng(1000 + worker)
        hot = HotTier.attach(name, timeout_s=20)
        x = rng.standard_normal((16, hot.dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        ids = np.int64(7 << 58) + worker * 1000 + np.arange(16)
        ns = int(rng.integers(1 << 40, 1 << 62))
        wrong, found, searches = [], 0, 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            hot.upsert(ids, x, ns)  # the fuzzer may evict or clear them: put them back every round
            for i in range(16):
                res = hot.search(x[i], k=4, namespace_hash=ns)
                searches += 1
                got = res.ids[0, : res.hits]
                scores = res.scores[0, : res.hits]
                if not set(got.tolist()) <= set(ids.tolist()):
                    wrong.append(f"foreign ids {got}")
                    continue
                exact = x[got - ids[0]] @ x[i]
                if not np.allclose(scores, exact, atol=1e-5) or (np.diff(scores) > 1e-6).any():
                    wrong.append(f"scores {scores} vs exact {exact}")
                if ids[i] in got:
                    found += 1
                    if got[0] != ids[i]:
                        wrong.append(f"query {i}: own row not first: {got}")
        hot.close()
        queue.put((worker, searches, found, wrong[:5], None))
    except Exception as exc:  # report, never hang the parent
        queue.put((worker, 0, 0, [], repr(exc)))


@pytest.fixture(scope="session")
def sanitized_build(tmp_path_factory) -> Path:
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: cannot build the sanitizer variant of the sidecar")
    try:
        return build_sanitized(tmp_path_factory.mktemp("asan-build"))
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"building the ASan/UBSan sidecar failed:\n{exc.stdout}\n{exc.stderr}")


@pytest.fixture
def asan_sidecar(sanitized_build, tmp_path):
    started: list[SanitizedSidecar] = []

    def _start(**kw) -> SanitizedSidecar:
        side = SanitizedSidecar(sanitized_build, f"fz-{uuid.uuid4().hex[:12]}", tmp_path / f"sidecar-{len(started)}.log",
                                **kw)
        started.append(side)
        return side

    yield _start
    for side in started:
        side.stop()


def run_fuzzer(build: Path, name: str, *args: str, timeout: float = 120) -> dict:
    out = subprocess.run([str(build / "tr-fuzz-client"), "--name", name, *args], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **SANITIZER_ENV})
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"fuzzer printed no summary (rc {out.returncode}): {out.stderr[-2000:]}"
    summary = json.loads(lines[-1])
    summary["rc"] = out.returncode
    summary["stderr"] = out.stderr[-2000:]
    return summary


@pytest.mark.slow
def test_fuzzed_sidecar_stays_up_with_no_sanitizer_report_and_honest_clients_stay_right(sanitized_build, asan_sidecar):
    side = asan_sidecar(dim=16, capacity=4000, slots=16)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    honest = [ctx.Process(target=honest_client, args=(side.name, w, 12.0, queue)) for w in range(2)]
    for p in honest:
        p.start()
    time.sleep(1.0)  # let the honest clients attach and insert before the storm
    summary = run_fuzzer(sanitized_build, side.name, "--requests", "150000", "--seconds", "10", "--inflight", "8",
                         "--seed", str(int.from_bytes(os.urandom(4), "little")))
    results = [queue.get(timeout=60) for _ in honest]
    for p in honest:
        p.join(10)
    assert summary["rc"] == 0, summary
    assert summary["anomalies"] == 0 and summary["hangs"] == 0 and summary["sidecar_alive"], summary
    assert summary["answered"] >= 5_000, f"fuzzer only got {summary['answered']} requests through: {summary}"
    for worker, searches, found, wrong, err in results:
        assert err is None, f"honest client {worker} failed: {err}"
        assert not wrong, f"honest client {worker} got wrong answers: {wrong}"
        assert searches > 50 and found >= searches // 2, (worker, searches, found)
    assert side.popen.poll() is None, f"sidecar died: {side.log()[-3000:]}"
    code = side.stop()
    reports = sanitizer_reports(side.log())
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:40]) + "\n" + side.log()[-4000:]
    assert code == 0, f"sanitized sidecar exited {code}: {side.log()[-3000:]}"


@pytest.mark.slow
def test_scribbled_header_geometry_neither_crashes_nor_misleads_the_sidecar(sanitized_build, asan_sidecar):
    """A client can write the whole header; the sidecar must serve from its own copy of the geometry."""
    side = asan_sidecar(dim=8, capacity=100, slots=4)
    # bounded by time, not count: header rounds start after 200 ms, and a fast machine answers
    # tens of thousands of requests before that
    summary = run_fuzzer(sanitized_build, side.name, "--requests", "100000000", "--seconds", "3", "--header-garbage",
                         "--seed", "7")
    assert summary["rc"] == 0 and summary["header_rounds"] >= 2, summary
    with HotTier.attach(side.name) as hot:  # header restored by the fuzzer: an honest client works
        hot.clear()  # the fuzzer's rows (and namespaces: 42 is one of its favourites) are still there
        x = np.eye(8, dtype=np.float32)
        hot.upsert(np.arange(100, 108), x, 42)
        res = hot.search(x[3].copy(), k=2, namespace_hash=42)
        assert res.ids[0, 0] == 103 and abs(res.scores[0, 0] - 1.0) < 1e-6
    code = side.stop()
    reports = sanitizer_reports(side.log())
    assert not reports, "\n".join(reports[:40])
    assert code == 0


def test_contains_at_the_largest_accepted_count_stays_inside_its_slot(start):
    """A CONTAINS of the most ids the sidecar accepts must not write its reply into the next slot."""
    _, hot = start(dim=8, capacity=10, slots=4)
    hot.upsert([0], np.eye(8, dtype=np.float32)[:1], 3)  # id 0 present: every reply byte is 1, not 0
    h = hot._header
    payload = int(h.slot_payload_bytes)
    at = h.slots_offset + L.SLOT_HEADER_BYTES
    hot._mm[at: at + payload] = bytes(payload)  # the ids asked: all 0
    sentinel_state = L.Slot.from_buffer(hot._mm, h.slots_offset + 1 * h.slot_bytes)
    before = bytes(hot._mm[h.slots_offset + h.slot_bytes: h.slots_offset + h.slot_bytes + 64])
    slot = L.Slot.from_buffer(hot._mm, h.slots_offset)
    accepted = None
    for count in range(payload // 9, payload // 9 - 80, -1):
        slot.state = L.SLOT_CLAIMED
        slot.owner_pid = os.getpid()
        slot.opcode, slot.flags, slot.k, slot.count = L.OP_CONTAINS, 0, 0, count
        slot.seq += 1
        slot.state = L.SLOT_REQUEST
        h.doorbell += 1
        deadline = time.monotonic() + 5
        while slot.state != L.SLOT_DONE:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        status = slot.status
        slot.owner_pid = 0
        slot.state = L.SLOT_FREE
        if status == L.OK:
            accepted = count
            break
    assert accepted is not None
    assert L.contains_reply_offset(accepted) + accepted <= payload, f"accepted {accepted} ids: reply overflows"
    assert bytes(hot._mm[h.slots_offset + h.slot_bytes: h.slots_offset + h.slot_bytes + 64]) == before
    assert sentinel_state.state == L.SLOT_FREE
