"""Write-ahead log of the cold tier, its writer side: adds are durable once fsynced here; a flusher moves them into
LanceDB in batches (the format and its readers are shared with the hot tier: tiered_recall.sync)."""
from __future__ import annotations

import mmap
import os
import time

from ..sync import HEADER_SIZE, FileLock, Header, log_generations, log_path, lock_held, pack_header, parse_records, \
    read_all, read_position, write_position

# How the log is written (_writer.py appends and flushes, _follower.py reads; docs/cold-tier.md tells it in prose;
# tiered_recall/sync/log_format.py gives the files and records):
# - Two cross-process locks (sync.FileLock: an flock, plus a mutex for the threads of one process), taken in this
#   order: the flush lock (.flush.lock) for a whole flush and for every LanceDB write that changes rows; the append
#   lock (.lock) for appends, for a flush's look at the log and its rotation, and for the whole of a write that
#   bypasses the log (delete, large add). Such a write flushes the log first and runs while it is empty, so records in
#   a generation are always newer than every row change committed since that generation began (a flush of its own
#   records aside). A reader loading table version V applies the records of the newest generation whose
#   base_version <= V and of all later ones, and has a consistent view without taking any lock.
# - A flush commits the last operation of each id (delete, or upsert of its newest row), so a delete reaches every
#   process through the log like an add, and a row deleted after it was logged never comes back. The two notes are
#   skipped by a flush (which still rotates them away). The versions in (pre_version, base_version] of a header are
#   the flush's own commits and compactions (direct writes wait for the flush lock), so a reader that applied the
#   generation's records knows every one of them.
# - A flush takes the records present (up to offset E), commits them (upsert by id: replay is idempotent) while
#   appends go on, then rotates: the new generation starts with a copy of the records appended since E ("carried";
#   the header says E and how many bytes), so no record is ever only in a file that is no longer current. Killed
#   before the rotation, the records are flushed again by the next flusher; killed mid-append, the torn record (bad
#   checksum or short) was never acknowledged and is cut off by the next writer.
# - Old generations stay a while (readers that fell behind follow them), then are deleted oldest first.

LOCK_NAME = ".lock"
FLUSH_LOCK_NAME = ".flush.lock"
SYNC_LOCK_NAME = ".sync.lock"  # its first two words hold the (generation, offset) made durable; the lock, their moves


class WriteAheadLog:
    """The log folder of one store, as seen by one process: the writer side (under `locked()`) and file helpers."""

    def __init__(self, folder: str, *, retention_s: float = 120.0, keep_generations: int = 8, read_only: bool = False):
        self.folder = folder
        self.retention_s = retention_s
        self.keep_generations = keep_generations
        self.read_only = read_only
        self._wfd: int | None = None
        self._wgen = 0
        self._wend = 0  # end of the last intact record of the current generation (valid under the lock)
        self._closed = False
        self._append_lock = self._flush_lock = self._sync_lock = None
        self._flush_probe_fd: int | None = None
        probe = os.path.join(folder, FLUSH_LOCK_NAME)
        if read_only:  # a follower only: no lock files are made, nothing is appended, flushed or pruned
            if os.path.exists(probe):
                self._flush_probe_fd = os.open(probe, os.O_RDONLY)
            return
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self._append_lock = FileLock(os.path.join(folder, LOCK_NAME))
        self._flush_lock = FileLock(probe)
        self._sync_lock = FileLock(os.path.join(folder, SYNC_LOCK_NAME))
        for lock in (self._append_lock, self._flush_lock):
            lock.fd  # noqa: B018 (opened now: the files exist for every later probe of them)
        if os.fstat(self._sync_lock.fd).st_size < mmap.PAGESIZE:
            os.ftruncate(self._sync_lock.fd, mmap.PAGESIZE)
        self._synced_map = mmap.mmap(self._sync_lock.fd, mmap.PAGESIZE)
        self._synced_words = memoryview(self._synced_map).cast("Q")
        self._flush_probe_fd = os.open(probe, os.O_RDWR)  # for flush_in_progress()
        with self.locked():
            if not self.generations():
                self._write_generation(Header(1, 0, -1, -1))

    # ---- files ----------------------------------------------------------------------------------
    def path_of(self, gen: int) -> str:
        """The file of generation `gen` (<folder>/<gen, 16 digits>.wal)."""
        return log_path(self.folder, gen)

    def generations(self) -> list[int]:
        """The generations on disk, oldest first."""
        return log_generations(self.folder)

    def open_gen(self, gen: int) -> int:
        """A read-only fd on generation `gen` (FileNotFoundError once it was deleted)."""
        return os.open(self.path_of(gen), os.O_RDONLY)

    def _write_generation(self, header: Header, carried: bytes = b"") -> None:
        tmp = os.path.join(self.folder, f".{header.gen:016d}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = pack_header(header) + carried
            if os.write(fd, data) != len(data):
                raise OSError(28, "No space left on device: short write of a new log generation")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path_of(header.gen))
        dfd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # ---- the lock -------------------------------------------------------------------------------
    def flushing(self):
        """The flush lock: exclusive across processes and threads (re-entrant); take it before locked()."""
        if self._flush_lock is None:
            raise RuntimeError("a read-only log takes no locks: nothing may write through it")
        return self._flush_lock.held()

    def locked(self):
        """The append lock: exclusive across processes and threads (re-entrant within one thread)."""
        if self._append_lock is None:
            raise RuntimeError("a read-only log takes no locks: nothing may write through it")
        return self._append_lock.held()

    def _refresh_locked(self) -> None:
        """Point the writer at the current generation and cut a torn tail left by a writer that died."""
        if self._wfd is not None and not os.path.exists(self.path_of(self._wgen + 1)):
            current = self._wgen
        else:
            gens = self.generations()
            current = gens[-1]
            if self._wfd is not None:
                os.close(self._wfd)
            self._wfd = os.open(self.path_of(current), os.O_RDWR)
            self._wgen = current
            self._wend = HEADER_SIZE
        size = os.fstat(self._wfd).st_size
        if size != self._wend:
            _, end = parse_records(read_all(self._wfd, self._wend), self._wend)
            self._wend = end
            if size > end:  # bytes past the last intact record: a dead writer's unacknowledged add
                os.ftruncate(self._wfd, end)
                os.fsync(self._wfd)

    # ---- writer side (call under locked()) ------------------------------------------------------
    def append(self, record: bytes) -> tuple[int, int]:
        """Append one encoded record and make it durable (fdatasync) before returning; returns the (generation,
        offset) just past it."""
        end, fd = self.write(record)
        try:
            self.sync(fd)  # under the append lock: no record after this one to share the sync with
        finally:
            os.close(fd)
        return end

    def write(self, record: bytes) -> tuple[tuple[int, int], int]:
        """Append one encoded record, not yet durable: ((generation, offset) just past it, an fd of its own on the
        generation for sync(), which the caller closes). Group commit: the caller syncs after it lets go of the
        lock, so one fdatasync makes every record written before it durable, and the writers waiting for the lock
        meanwhile append theirs."""
        self._refresh_locked()
        try:
            written = os.pwrite(self._wfd, record, self._wend)
            if written != len(record):
                raise OSError(28, f"No space left on device: short write to the log ({written} of {len(record)} bytes)")
        except BaseException:
            try:  # not acknowledged, so not kept: a later flush must not commit it
                os.ftruncate(self._wfd, self._wend)
            except OSError:
                pass  # the next writer cuts it (a short record fails its checksum)
            raise
        self._wend += len(record)
        return (self._wgen, self._wend), os.dup(self._wfd)

    def sync(self, fd: int, end: tuple[int, int] | None = None) -> None:
        """Makes what was written to the log file fd is open on durable, up to `end` at least (fdatasync). Group
        commit across processes: an fdatasync covers every record written to the file before it began, and a writer
        whose record an earlier one covered returns without its own (the sync lock file holds the position made
        durable: a hint, so it is not synced itself). The fdatasync takes no lock: a writer descheduled while it
        held one would make every other writer wait for a core (the kernel merges concurrent fdatasyncs of a file);
        the sync lock covers only the move of the position, and a writer that finds it taken leaves the position to
        the holder (a later writer then syncs once more than it had to)."""
        if end is None or self._sync_lock is None:
            os.fdatasync(fd)
            return
        if self._synced() >= tuple(end):
            return
        covered = (end[0], os.fstat(fd).st_size)  # written before the fdatasync begins: durable when it returns
        os.fdatasync(fd)
        with self._sync_lock.held(wait=False) as got:
            if got and self._synced() < covered:  # never moved back: the position only grows
                write_position(self._synced_words, 0, covered)

    def _synced(self) -> tuple[int, int]:
        """The (generation, offset) up to which the log is known to be durable (the sync lock file's first two
        words, mapped)."""
        return read_position(self._synced_words, 0)

    def end_locked(self) -> tuple[int, int]:
        """The (generation, offset) past the last intact record (call under locked())."""
        self._refresh_locked()
        return self._wgen, self._wend

    def pending(self) -> tuple[int, list[tuple[int, bytes]], int]:
        """The current generation, its intact records and the offset past them (for a flush)."""
        self._refresh_locked()
        records, end = parse_records(read_all(self._wfd, HEADER_SIZE), HEADER_SIZE)
        return self._wgen, records, end

    def rotate(self, gen: int, flushed_to: int, pre_version: int, base_version: int) -> Header:
        """Start a new generation after generation `gen`'s records up to offset `flushed_to` were committed at
        `base_version`; the records appended past `flushed_to` meanwhile are copied to its start."""
        self._refresh_locked()
        if self._wgen != gen or self._wend < flushed_to:
            raise RuntimeError(f"log generation {gen} changed during its flush (now {self._wgen}); another flusher "
                               "ran without the flush lock")
        carried = os.pread(self._wfd, self._wend - flushed_to, flushed_to) if self._wend > flushed_to else b""
        header = Header(gen + 1, gen, int(pre_version), int(base_version), int(flushed_to), len(carried))
        self._write_generation(header, carried)
        self._refresh_locked()
        self._prune_locked()
        os.utime(self._flush_probe_fd)  # seconds_since_flush(), for every process
        return header

    def _prune_locked(self) -> None:
        gens = self.generations()
        old = gens[:-self.keep_generations] if len(gens) > self.keep_generations else []
        now = time.time()
        for gen in old:  # oldest first: a reader still holding a file finds every later one present
            path = self.path_of(gen)
            try:
                if now - os.stat(path).st_mtime < self.retention_s:
                    break
                os.unlink(path)
            except FileNotFoundError:
                continue

    # ---- reader helpers (no lock) ---------------------------------------------------------------
    def pending_bytes(self) -> int:
        """Bytes of records in the current generation (a cheap, lock-free look: 0 means nothing to flush)."""
        gens = self.generations()
        try:
            return max(0, os.stat(self.path_of(gens[-1])).st_size - HEADER_SIZE)
        except (FileNotFoundError, IndexError):
            return 0

    def seconds_since_flush(self) -> float:
        """Seconds since any process last rotated the log after a flush (the flush lock file's time); large when not
        known."""
        try:
            return time.time() - os.fstat(self._flush_probe_fd).st_mtime
        except (OSError, TypeError):
            return float("inf")

    def flush_in_progress(self) -> bool:
        """Whether a flush or a write that bypasses the log holds the flush lock now (this process's included)."""
        return self._flush_probe_fd is not None and lock_held(self._flush_probe_fd)

    def close(self) -> None:
        """Closes the log's files and locks; closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._flush_probe_fd is not None:
            os.close(self._flush_probe_fd)
        if self._append_lock is None:
            return
        with self._append_lock.mutex:
            if self._wfd is not None:
                os.close(self._wfd)
                self._wfd = None
            self._append_lock.close()
            self._flush_lock.close()
            self._synced_words.release()
            self._synced_map.close()
            self._sync_lock.close()
