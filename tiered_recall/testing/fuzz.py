"""Hostile-client fuzzing of the request ring: an ASan + UBSan build of the sidecar, the fuzz driver
(native/tools/fuzz_client.c), and honest clients that check every answer beside it. tests/native/test_fuzz.py runs it
short in CI, benchmarks/fuzz_sidecar.py long."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from ..hot import layout as L
from ..hot import HotTier, segment_path

SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:",
                     "SUMMARY: ")
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=0",
}


def build_sanitized(native_dir: Path, build_dir: Path) -> Path:
    """cmake -DTR_SANITIZE=ON -DTR_BUILD_FUZZ=ON of a checkout's native/ into build_dir; returns it (holds tr-sidecar
    and tr-fuzz-client)."""
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(native_dir), "-B", str(build_dir), *gen, "-DTR_CUDA=OFF", "-DTR_SANITIZE=ON",
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
        """The sidecar's output so far (stdout and stderr, where the sanitizers report)."""
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
    """The lines of a sidecar log that are sanitizer reports (SANITIZER_MARKERS)."""
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


def run_fuzzer(build: Path, name: str, *args: str, timeout: float = 120) -> dict:
    """Runs the sanitized tr-fuzz-client against sidecar `name` with `args`; returns the JSON summary it prints last,
    with its exit code (rc) and the tail of its stderr."""
    out = subprocess.run([str(build / "tr-fuzz-client"), "--name", name, *args], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **SANITIZER_ENV})
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"fuzzer printed no summary (rc {out.returncode}): {out.stderr[-2000:]}"
    summary = json.loads(lines[-1])
    summary["rc"] = out.returncode
    summary["stderr"] = out.stderr[-2000:]
    return summary
