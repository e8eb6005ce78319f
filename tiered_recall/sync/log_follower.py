"""Following the write-ahead log from a position: the records past it, in order, across rotations, without a lock
(log_format.py gives the files and records; a reader that falls behind a deleted generation is told so)."""
from __future__ import annotations

import os

from .log_format import HEADER_SIZE, Deleted, Header, Rows, decode_record, log_path, parse_records, read_all, read_header, \
    record_end


class LogFollower:
    """One process's read position in the log: new records and generation changes, in order, without the lock."""

    def __init__(self, folder: str):
        self.folder = folder
        self.gen = 0
        self.fd: int | None = None
        self.offset = 0
        self._paths = (0, "", "")  # (gen, its file, the next generation's file): built once per generation

    def _files(self) -> tuple[str, str]:
        """The files of the generation being read and of the next one (a poll looks at both)."""
        if self._paths[0] != self.gen:
            self._paths = (self.gen, log_path(self.folder, self.gen), log_path(self.folder, self.gen + 1))
        return self._paths[1], self._paths[2]

    def close(self) -> None:
        """Closes the fd of the generation being read (start_at opens one again)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def start_at(self, gen: int) -> Header:
        """Position at the first record of `gen` (FileNotFoundError when that generation was deleted)."""
        fd = os.open(log_path(self.folder, gen), os.O_RDONLY)
        try:
            header = read_header(fd)
        except Exception:
            os.close(fd)
            raise
        self.close()
        self.fd, self.gen, self.offset = fd, gen, HEADER_SIZE
        return header

    def seek(self, gen: int, offset: int) -> None:
        """Position at `offset` of generation `gen`, a record boundary (FileNotFoundError once it was deleted)."""
        if gen != self.gen or self.fd is None:
            self.start_at(gen)
        self.offset = max(int(offset), HEADER_SIZE)

    @property
    def position(self) -> tuple[int, int]:
        """(generation, offset) of the next record this follower reads."""
        return self.gen, self.offset

    def bytes_between(self, start: tuple[int, int], end: tuple[int, int]) -> float:
        """Bytes of records a follower at `start` reads before it reaches `end` (both record boundaries): the rest
        of start's generation and the records of the next one up to `end`, less the ones carried into it, which were
        read once already. Infinite when `end` lies more than one generation later, or a header it needs is gone."""
        if end[0] == start[0]:
            return float(max(0, end[1] - start[1]))
        if end[0] != start[0] + 1:
            return float("inf")
        try:
            fd = os.open(log_path(self.folder, end[0]), os.O_RDONLY)
        except FileNotFoundError:
            return float("inf")
        try:
            header = read_header(fd)
        except (OSError, ValueError):  # a header cut short or damaged: the follower's poll reports it
            return float("inf")
        finally:
            os.close(fd)
        # start's generation ends at carried_from + carried_len, and the next one begins with those carried_len bytes
        # again: (carried_from + carried_len - start) + (end - HEADER_SIZE - carried_len)
        return float(max(0, header.carried_from - start[1] + end[1] - HEADER_SIZE))

    def has_more(self) -> bool:
        """True when the log holds records past this position, or a later generation (a cheap look: no read);
        False before the follower was positioned."""
        if self.fd is None:
            return False
        return os.fstat(self.fd).st_size > self.offset or os.path.exists(self._files()[1])

    def poll(self) -> list:
        """Events since the last poll: ("rows", Rows), ("deleted", Deleted) or ("note", Note) for each new record (with
        the generation and offset it was read at), ("rotated", Header) when a new generation begins, ("gap", None) when generations
        were deleted before this process read them (reload from LanceDB)."""
        events: list = []
        while True:
            # Look for the next generation before reading: once it exists this one takes no more appends, so the
            # read below then gets all of it (a torn tail is a dead writer's garbage and was not flushed either).
            current, following = self._files()
            rotated = os.path.exists(following)
            if os.fstat(self.fd).st_size > self.offset:
                records, self.offset = parse_records(read_all(self.fd, self.offset), self.offset)
                for at, p in records:
                    rec = decode_record(p)
                    rec.gen, rec.offset, rec.end = self.gen, at, record_end(at, p)
                    kind = "rows" if isinstance(rec, Rows) else "deleted" if isinstance(rec, Deleted) else "note"
                    events.append((kind, rec))
            if not rotated:
                if not os.path.exists(current):
                    events.append(("gap", None))  # ours and (oldest first) every later one were deleted
                return events
            ended_at = self.offset
            try:
                header = self.start_at(self.gen + 1)
            except FileNotFoundError:
                events.append(("gap", None))
                return events
            if ended_at != header.carried_from + header.carried_len:
                events.append(("gap", None))  # cannot line the copied records up with what was read: reload
                return events
            self.offset = HEADER_SIZE + header.carried_len  # those records were read from the previous generation
            events.append(("rotated", header))
