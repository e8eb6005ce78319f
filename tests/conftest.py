"""Shared fixtures: an isolated sidecar per test (own segment name, stopped and removed afterwards), GPU gating, a
wall clock a test moves forward."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid

import pytest

from tiered_recall import hot as sc


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cuda-persist", choices=("on", "off"), default="on",
                     help="GPU tests: CUDA sidecars run the persistent kernel (on, the default) or launch per pass "
                          "(off); tests of the persistent kernel itself skip with off")


def _cuda_compiled() -> bool:
    try:
        out = subprocess.run([str(sc.sidecar_executable()), "--backends"], capture_output=True, text=True, timeout=10)
    except Exception:
        return False
    return "cuda" in out.stdout.split()


def _gpu_visible() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except Exception:
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def _gpu_required(config: pytest.Config) -> bool:
    """On a GPU machine (TR_REQUIRE_GPU=1, or `-m gpu` asked for) GPU tests must run: never skip."""
    markexpr = config.getoption("-m") or ""
    return os.environ.get("TR_REQUIRE_GPU") == "1" or ("gpu" in markexpr and "not gpu" not in markexpr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_required(config):
        return  # the gpu_guard fixture fails them loudly if the GPU or CUDA build is missing
    cuda = _cuda_compiled()
    gpu = _gpu_visible()
    reason = None
    if not cuda:
        reason = "built without CUDA support (no nvcc at install time)"
    elif not gpu:
        reason = "no GPU available on this machine"
    if reason:
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def gpu_guard(request: pytest.FixtureRequest) -> None:
    if "gpu" in request.keywords:
        if not _cuda_compiled():
            pytest.fail("GPU test on a build without the CUDA backend: reinstall with nvcc present (TR_CUDA=ON)")
        if not _gpu_visible():
            pytest.fail("GPU test but nvidia-smi sees no GPU")


@pytest.fixture(autouse=True)
def away_from_the_checkout(tmp_path, monkeypatch) -> None:
    """Every test (and every child interpreter it starts) runs in its own empty folder: from the
    repository root, `python -c` / `-m` would import the source tree, which lacks the installed
    pieces (tiered_recall.storage is mapped in from storage/, the native binaries are built)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def cuda_options(request: pytest.FixtureRequest) -> dict:
    """start_sidecar keywords for a CUDA sidecar in a test: poisoned result buffers (a result the kernels failed to
    write shows up as garbage, not as a stale, plausible answer) and the persistent kernel as --cuda-persist says."""
    return {"test_poison_results": True, "cuda_persist": request.config.getoption("--cuda-persist") == "on"}


@pytest.fixture
def persistent_kernel(cuda_options: dict) -> dict:
    """cuda_options for a test of the persistent kernel itself: skips when the run asked for --cuda-persist off, and
    turns the int8 codes off (with them, tiers of --codes-min-rows rows and more are launched, not the kernel's)."""
    if not cuda_options["cuda_persist"]:
        pytest.skip("tests the persistent kernel: this run has --cuda-persist off")
    return {**cuda_options, "codes": "off"}


@pytest.fixture
def segment_name() -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    path = sc.SHM_DIR / f"tiered-recall.{name}"
    if path.exists():
        path.unlink()


@pytest.fixture
def start(segment_name: str):
    """start(dim=..., capacity=..., **kw) -> (SidecarProcess, HotTier); everything is stopped afterwards."""
    started: list[tuple[sc.SidecarProcess, sc.HotTier]] = []

    def _start(*, name: str | None = None, **kwargs):
        name = name or segment_name
        proc = sc.start_sidecar(name, **kwargs)
        hot = sc.HotTier.attach(name, timeout_s=kwargs.pop("timeout_s", 10.0))
        started.append((proc, hot))
        return proc, hot

    yield _start
    for proc, hot in started:
        hot.close()
        proc.stop()


@pytest.fixture
def open_memory(tmp_path, request):
    """open_memory(path=None, **kw) -> TieredMemory over a fresh folder (raw vectors of the test
    module's DIM, CPU hot tier, short orphan grace); every sidecar it started is stopped after."""
    from tiered_recall import TieredMemory

    opened = []

    def _open(path=None, **kwargs):
        kwargs.setdefault("dim", request.module.DIM)
        kwargs.setdefault("embedder", None)
        kwargs.setdefault("device", "cpu")
        kwargs.setdefault("orphan_grace_s", 2.0)
        memory = TieredMemory(path or tmp_path / f"store{len(opened)}", **kwargs)
        opened.append(memory)
        return memory

    yield _open
    for memory in opened:
        name = memory.sidecar_name
        memory.close()
        if sc.segment_path(name).exists():
            try:
                with sc.HotTier.attach(name) as hot:
                    os.kill(hot.owner_pid, signal.SIGTERM)
            except Exception:
                pass


@pytest.fixture
def stop_sidecar_after():
    """stop_sidecar_after(path): the sidecar of the store at path (if one runs) is stopped after the test."""
    paths = []
    yield paths.append
    from tiered_recall.coordinator.link import sidecar_name_of  # the coordinator: not needed by hot-tier tests

    for path in paths:
        name = sidecar_name_of(path)
        if sc.segment_path(name).exists():
            try:
                with sc.HotTier.attach(name) as hot:
                    os.kill(hot.owner_pid, signal.SIGTERM)
            except Exception:
                pass  # gone meanwhile: it exits by itself once orphaned


@pytest.fixture
def wall_clock(monkeypatch):
    """wall_clock(seconds) moves this process's wall clock (time.time_ns, which every expiry reads) forward. A test of
    times to live then depends on no sleep being long enough on a loaded machine: the clock moves only when it says."""
    real_time_ns = time.time_ns
    offset_ns = [0]
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + offset_ns[0])

    def advance(seconds: float) -> None:
        offset_ns[0] += int(seconds * 1e9)

    return advance
