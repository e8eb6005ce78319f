"""Starting and stopping a sidecar: its command line, a child process, or a daemon that outlives this process."""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import weakref
from typing import Sequence

import numpy as np

from ..errors import InvalidInput, SidecarUnavailable
from . import layout as L
from .segment import segment_path, validate_name
from .native import sidecar_executable
from .proc import pid_alive


CPU_ISAS = ("auto", "avx512-vnni", "avx-vnni", "avx2", "scalar")  # --test-cpu-isa's choices


def _unnamed_log(name: str) -> int:
    """A file for a sidecar's output with no name in any folder: it goes when the last descriptor on it closes, so
    nothing is left in /tmp however the sidecar or this process ends (a kill, a test that never stops it)."""
    fd, path = tempfile.mkstemp(prefix=f"tr-sidecar-{name}-", suffix=".log")
    os.unlink(path)
    return fd


def _read_log(fd: int) -> str:
    """Everything written to an unnamed log so far ("" when it cannot be read)."""
    try:
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
    except OSError:
        return ""


class SidecarProcess:
    """A sidecar this process started (spawn + exec, never fork of a Python with state). Its output goes to an
    unnamed file (log() reads it), closed by stop(), kill() or garbage collection."""

    def __init__(self, name: str, popen: subprocess.Popen, log_fd: int) -> None:
        self.name = name
        self.popen = popen
        self._log_fd = log_fd
        self._close_log = weakref.finalize(self, os.close, log_fd)
        self.server_pid = popen.pid  # differs when a wrapper (start_sidecar(wrapper=...)) runs it

    @property
    def pid(self) -> int:
        """The child's pid (a wrapper's, when one runs the sidecar: see server_pid)."""
        return self.popen.pid

    def running(self) -> bool:
        """True while the child has not exited."""
        return self.popen.poll() is None

    def log(self) -> str:
        """The sidecar's log so far ("" when it cannot be read, or after stop())."""
        return _read_log(self._log_fd) if self._close_log.alive else ""

    def stop(self, timeout_s: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after timeout_s; removes the segment if the sidecar could not."""
        if self.popen.poll() is None:
            if self.server_pid != self.popen.pid:  # under a wrapper: stop the sidecar, the wrapper follows
                try:
                    os.kill(self.server_pid, signal.SIGTERM)
                except ProcessLookupError:
                    self.popen.send_signal(signal.SIGTERM)
            else:
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        try:
            path = segment_path(self.name)
            if path.exists():
                raw = path.read_bytes()[: L.HEADER_BYTES]
                if len(raw) == L.HEADER_BYTES and L.Header.from_buffer_copy(raw).owner_pid == self.popen.pid:
                    path.unlink()
        except OSError:
            pass
        self._close_log()
        return int(self.popen.returncode)

    def kill(self) -> None:
        """SIGKILL without clean-up of the segment (tests use it to leave a stale one)."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._close_log()


def _flag_int(label: str, value, minimum: int = 0) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidInput(f"{label} must be an int >= {minimum}, got {value!r}")
    return str(int(value))


def sidecar_args(name: str, *, dim: int, capacity: int, dtype: str | None = None, backend: str = "cpu",
                 slots: int | None = None, threads: int | None = None, idle_spin_us: int | None = None,
                 exit_when_orphaned_s: float | None = None, verbose: bool = False, gather_us: int | None = None,
                 cuda_persist: bool | None = None, cuda_one_trip_max_rows: int | None = None,
                 cuda_split_max_rows: int | None = None, cuda_verbose: bool = False, cuda_profile: bool = False,
                 codes: str | None = None, codes_min_rows: int | None = None, test_cpu_isa: str | None = None,
                 test_poison_results: bool = False, test_no_zero_copy: bool = False,
                 test_batched_server: bool = False) -> list[str]:
    """The tr-sidecar command line for these options (docs/sidecar-options.md has the table; None: its default).

    gather_us: how long the server waits for the clients of a batch to come back (0: off). cuda_persist: the
    persistent kernel (False: a launch per pass). cuda_one_trip_max_rows, cuda_split_max_rows: the persistent
    kernel's builds by tier size. cuda_verbose: log the backend's choices and each persistent-kernel stop;
    cuda_profile: its stage profile. codes: "int8" (8-bit codes beside the rows, scanned first; exact answers) or
    "off"; codes_min_rows: tiers of fewer rows scan the rows. test_*: flags for tests only (the CPU scan's
    instructions, poisoned result buffers, results copied instead of written into the slots, the server's batched
    path on any backend).
    """
    validate_name(name)
    if not isinstance(dim, (int, np.integer)) or not 1 <= dim <= L.MAX_DIM:
        raise InvalidInput(f"dim must be an int in 1..{L.MAX_DIM}, got {dim!r}")
    if not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise InvalidInput(f"capacity must be a positive int (rows), got {capacity!r}")
    if dtype not in (None, "f32", "f16", "float32", "float16"):
        raise InvalidInput(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    if backend not in ("cpu", "cuda"):
        raise InvalidInput(f"backend must be 'cpu' or 'cuda', got {backend!r}")
    if codes not in (None, "int8", "off"):
        raise InvalidInput(f"codes must be 'int8' or 'off', got {codes!r}")
    if test_cpu_isa not in (None, *CPU_ISAS):
        raise InvalidInput(f"test_cpu_isa must be one of {', '.join(CPU_ISAS)}, got {test_cpu_isa!r}")
    args = [str(sidecar_executable()), "--name", name, "--dim", str(int(dim)), "--capacity", str(int(capacity)),
            "--backend", backend]
    if dtype:
        args += ["--dtype", {"float32": "f32", "float16": "f16"}.get(dtype, dtype)]
    if slots:
        args += ["--slots", str(int(slots))]
    if threads:
        args += ["--threads", str(int(threads))]
    if idle_spin_us is not None:
        args += ["--idle-spin-us", _flag_int("idle_spin_us", idle_spin_us)]
    if exit_when_orphaned_s:
        args += ["--exit-when-orphaned", str(max(1, int(round(exit_when_orphaned_s))))]
    if gather_us is not None:
        args += ["--gather-us", _flag_int("gather_us", gather_us)]
    if cuda_persist is not None:
        if not isinstance(cuda_persist, bool):
            raise InvalidInput(f"cuda_persist must be True or False, got {cuda_persist!r}")
        args += ["--cuda-persist", "on" if cuda_persist else "off"]
    if cuda_one_trip_max_rows is not None:
        args += ["--cuda-one-trip-max-rows", _flag_int("cuda_one_trip_max_rows", cuda_one_trip_max_rows)]
    if cuda_split_max_rows is not None:
        args += ["--cuda-split-max-rows", _flag_int("cuda_split_max_rows", cuda_split_max_rows)]
    if codes is not None:
        args += ["--codes", codes]
    if codes_min_rows is not None:
        args += ["--codes-min-rows", _flag_int("codes_min_rows", codes_min_rows)]
    if test_cpu_isa is not None:
        args += ["--test-cpu-isa", test_cpu_isa]
    for flag, on in (("--verbose", verbose), ("--cuda-verbose", cuda_verbose), ("--cuda-profile", cuda_profile),
                     ("--test-poison-results", test_poison_results), ("--test-no-zero-copy", test_no_zero_copy),
                     ("--test-batched-server", test_batched_server)):
        if on:
            args.append(flag)
    return args


class DetachedSidecar:
    """A sidecar started with detach=True: a daemon in its own session, not a child of this process."""

    def __init__(self, name: str, pid: int) -> None:
        self.name = name
        self.pid = pid

    def running(self) -> bool:
        """True while the daemon's process is alive."""
        return pid_alive(self.pid)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM; SIGKILL when it has not exited after timeout_s."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while pid_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if pid_alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)


def start_sidecar(name: str, *, dim: int, capacity: int, dtype: str | None = None, backend: str = "cpu",
                  slots: int | None = None, threads: int | None = None, idle_spin_us: int | None = None,
                  exit_when_orphaned_s: float | None = None, ready_timeout_s: float = 30.0,
                  detach: bool = False, gather_us: int | None = None, cuda_persist: bool | None = None,
                  cuda_one_trip_max_rows: int | None = None, cuda_split_max_rows: int | None = None,
                  cuda_verbose: bool = False, cuda_profile: bool = False, codes: str | None = None,
                  codes_min_rows: int | None = None, test_cpu_isa: str | None = None,
                  test_poison_results: bool = False, test_no_zero_copy: bool = False,
                  test_batched_server: bool = False,
                  wrapper: Sequence[str] | None = None) -> SidecarProcess | DetachedSidecar:
    """Starts `tr-sidecar` (exec'd, never a fork of this interpreter's state) and waits until it serves.

    The sidecar's options are sidecar_args's. detach=True makes it a daemon in its own session that outlives this
    process (with exit_when_orphaned_s set, it exits once no client has been attached for that long); its
    readiness comes back through a pipe, so a failed start is reported at once.

    wrapper: a command prefix for tools that must own the sidecar process, e.g. ["compute-sanitizer", "--tool",
    "memcheck"]. The sidecar is then the wrapper's child, so readiness is taken from a segment created after this
    start (not with detach).
    """
    if isinstance(wrapper, (str, bytes)):
        raise InvalidInput(f"wrapper must be a list of words, e.g. shlex.split({wrapper!r})")
    wrapper = [str(part) for part in wrapper or ()]
    if wrapper and detach:
        raise InvalidInput("wrapper and detach=True do not go together: a daemon forks away from its wrapper")
    args = sidecar_args(name, dim=dim, capacity=capacity, dtype=dtype, backend=backend, slots=slots,
                        threads=threads, idle_spin_us=idle_spin_us, exit_when_orphaned_s=exit_when_orphaned_s,
                        verbose=True, gather_us=gather_us, cuda_persist=cuda_persist,
                        cuda_one_trip_max_rows=cuda_one_trip_max_rows, cuda_split_max_rows=cuda_split_max_rows,
                        cuda_verbose=cuda_verbose, cuda_profile=cuda_profile, codes=codes,
                        codes_min_rows=codes_min_rows, test_cpu_isa=test_cpu_isa,
                        test_poison_results=test_poison_results, test_no_zero_copy=test_no_zero_copy,
                        test_batched_server=test_batched_server)
    log_fd = _unnamed_log(name)
    if detach:
        return _start_detached(name, args, log_fd, ready_timeout_s)
    started_ns = time.time_ns()
    try:
        popen = subprocess.Popen(wrapper + args, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                 close_fds=True)
    except BaseException:
        os.close(log_fd)
        raise
    proc = SidecarProcess(name, popen, log_fd)
    deadline = time.monotonic() + ready_timeout_s
    path = segment_path(name)
    while True:
        if popen.poll() is not None:
            message = proc.log().strip() or f"exit code {popen.returncode}"
            proc.stop()
            raise SidecarUnavailable(f"sidecar {name!r} failed to start: {message}")
        try:
            with open(path, "rb") as f:
                raw = f.read(L.HEADER_BYTES)
            if len(raw) == L.HEADER_BYTES:
                head = L.Header.from_buffer_copy(raw)
                ours = head.owner_pid == popen.pid or (wrapper and head.started_ns >= started_ns)
                if ours and head.state == L.SERVER_READY:
                    proc.server_pid = int(head.owner_pid)
                    return proc
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.stop()
            raise SidecarUnavailable(f"sidecar {name!r} did not become ready within {ready_timeout_s:g} s")
        time.sleep(0.002)


def _start_detached(name: str, args: list[str], log_fd: int, ready_timeout_s: float) -> DetachedSidecar:
    read_end, write_end = os.pipe()
    try:
        launcher = subprocess.Popen(args + ["--daemon", "--ready-fd", str(write_end)], stdin=subprocess.DEVNULL,
                                    stdout=log_fd, stderr=log_fd, pass_fds=(write_end,))
    except BaseException:
        os.close(log_fd)
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    try:
        return _await_daemon(name, launcher, read_end, log_fd, ready_timeout_s)
    finally:
        os.close(log_fd)  # the daemon keeps its own descriptor on the log while it runs


def _await_daemon(name: str, launcher: subprocess.Popen, read_end: int, log_fd: int,
                  ready_timeout_s: float) -> DetachedSidecar:
    import select

    launcher.wait()  # the launcher exits as soon as the daemon is forked
    data = b""
    deadline = time.monotonic() + ready_timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([read_end], [], [], remaining)
            if not ready:
                break
            chunk = os.read(read_end, 64)
            if not chunk:
                break  # EOF: the daemon said ready and closed, or it died
            data += chunk
    finally:
        os.close(read_end)
    if data.startswith(b"ready "):
        return DetachedSidecar(name, int(data.split()[1]))
    message = _read_log(log_fd).strip()
    raise SidecarUnavailable(f"sidecar {name!r} failed to start: {message or 'no readiness within ' + str(ready_timeout_s) + ' s'}")
