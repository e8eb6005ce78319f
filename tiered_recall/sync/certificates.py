"""Hot-tier certificates: which slots of namespaces a search may answer from the hot tier alone, proved against
the cold tier's write generations. docs/skip-rules.md gives the invariant and why every writer keeps it.

A certificate for generation slot s says: for every namespace in slot s, the hot tier holds only rows that the
cold tier holds, with the same vector and namespace, and the sidecar's published total of the namespace is the
cold tier's count. It is valid while the slot's write generation (and the store's count of unplaced writes)
still equals the one certified, and only for the sidecar instance (owner pid, start time) it names.

Layout of the file `hot_certificates` in the store folder (little-endian u64 words):
  word 0     magic "TRCERT1\\0"        word 1  format version (low 32 bits), slot count (high 32 bits)
  words 8-9  the sidecar instance: owner pid, start time (ns); 0 = nothing is certified
  word 10    certified writes (the whole store: namespace=None searches)
  word 11    certified unplaced writes
  words 12-13  the write-ahead log position (generation, offset) up to which every logged write's hot-tier side
             has been applied (group commit, hot_writes.py); generation 0: not known
  word 16+s  certified generation of slot s
Reads take no lock (each word one aligned load); every change is made under the store's write lock.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import StorageError
from ..namespaces import namespace_hash
from .generations import FIRST_SLOT_WORD, SLOTS, WORD_UNPLACED, WORD_WRITES, Bump, Snapshot, WriteGenerations, slot_of
from .log_format import read_position, write_position

FILE_NAME = "hot_certificates"
MAGIC = int.from_bytes(b"TRCERT1\0", "little")
VERSION = 1
_EPOCH_PID, _EPOCH_STARTED, _CERT_WRITES, _CERT_UNPLACED = 8, 9, 10, 11
_APPLIED_GEN = 12  # and word 13, the offset (log_format.read_position)
_FILE_BYTES = 8 * (FIRST_SLOT_WORD + SLOTS)
WHOLE_STORE = -1  # the slot of a token for a search over every namespace


# What a certified read saw, valid as long as `HotCertificates.still(token)` says so: (slot, or WHOLE_STORE for a
# search over every namespace; the slot's generation, or the store's writes; the unplaced writes). A plain tuple:
# it is made on every search.
Token = tuple


class HotCertificates:
    """The certificates of one store, against its write generations."""

    def __init__(self, folder: str | os.PathLike, generations: WriteGenerations) -> None:
        self._gens = generations
        self._g = generations.words
        path = os.path.join(os.fspath(folder), FILE_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"cannot open the hot-tier certificates at {path}: {exc}") from exc
        try:
            if os.fstat(fd).st_size < _FILE_BYTES:  # new (a racing creator writes the same header)
                os.ftruncate(fd, _FILE_BYTES)
                os.pwrite(fd, np.array([MAGIC, VERSION | (SLOTS << 32)], dtype="<u8").tobytes(), 0)
            self._mm = mmap.mmap(fd, _FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._c = memoryview(self._mm).cast("Q")
        self._slots = np.frombuffer(self._mm, dtype="<u8")[FIRST_SLOT_WORD:]
        if self._c[0] != MAGIC or self._c[1] != VERSION | (SLOTS << 32):
            self.close()
            raise StorageError(f"{path} is not a certificates file of this version: remove it (nothing is lost: "
                               "the hot tier is re-certified from the cold tier)")

    # ---- reads (the search path: a handful of loads) ----
    def check(self, slot: int | None, epoch: tuple[int, int]) -> Token | None:
        """A token when the hot tier of sidecar `epoch` is certified for `slot` (None: every namespace), else None."""
        c, g = self._c, self._g
        if c[_EPOCH_PID] != epoch[0] or c[_EPOCH_STARTED] != epoch[1]:
            return None
        if slot is None:
            writes = g[WORD_WRITES]
            return (WHOLE_STORE, writes, 0) if c[_CERT_WRITES] == writes else None
        generation, unplaced = g[FIRST_SLOT_WORD + slot], g[WORD_UNPLACED]
        if c[FIRST_SLOT_WORD + slot] != generation or c[_CERT_UNPLACED] != unplaced:
            return None
        return slot, generation, unplaced

    def still(self, token: Token) -> bool:
        """No write began since the token was taken (read after the hot answer and its counts)."""
        g = self._g
        slot, generation, unplaced = token
        if slot == WHOLE_STORE:
            return g[WORD_WRITES] == generation
        return g[FIRST_SLOT_WORD + slot] == generation and g[WORD_UNPLACED] == unplaced

    def epoch_matches(self, epoch: tuple[int, int]) -> bool:
        """True when the certificates name sidecar instance `epoch` (owner pid, start time)."""
        return self._c[_EPOCH_PID] == epoch[0] and self._c[_EPOCH_STARTED] == epoch[1]

    def stale_slots(self) -> np.ndarray:
        """Slots whose certificate no longer matches their generation."""
        return np.flatnonzero(self._slots != self._gens.slot_words)

    def current_at(self, slot: int | None, snap: Snapshot, epoch: tuple[int, int]) -> bool:
        """True when the certificates of sidecar `epoch` cover every write `snap` counts for `slot` (None: every
        namespace): a scope stale now is then stale only for writes that began after `snap`. Certificates only
        move forward through a chain of writes, so one at or past the snapshot's generation has them all."""
        c = self._c
        if not self.epoch_matches(epoch):
            return False
        if slot is None:
            return c[_CERT_WRITES] >= snap.writes
        return c[FIRST_SLOT_WORD + slot] >= int(snap.slots[slot]) and c[_CERT_UNPLACED] >= snap.unplaced

    def applied(self) -> tuple[int, int] | None:
        """The log position up to which the hot tier has every logged write's side (None: not known). Read without
        a lock (log_format.read_position)."""
        position = read_position(self._c, _APPLIED_GEN)
        return position if position[0] else None

    def certified_unplaced(self) -> int:
        """The count of unplaced writes the certificates were made at."""
        return int(self._c[_CERT_UNPLACED])

    def covers(self, end: tuple[int, int]) -> bool:
        """True when the hot tier has the side of the logged write whose record ends at `end`."""
        applied = self.applied()
        return applied is not None and applied >= tuple(end)

    # ---- changes (under the store's write lock) ----
    def set_applied(self, position: tuple[int, int] | None) -> None:
        """Every logged write before `position` has its hot-tier side (None: not known)."""
        write_position(self._c, _APPLIED_GEN, (0, 0) if position is None else position)

    def advance(self, bump: Bump | None, epoch: tuple[int, int]) -> None:
        """After a write whose hot-tier side was done in full (rows placed or dropped, totals published): each
        certificate that was current just before the write's bump is current after it. One that was not stays stale:
        another write left the hot tier behind, and only a repair may certify it again."""
        c = self._c
        if bump is None or not self.epoch_matches(epoch):
            return
        if bump.unplaced_before is not None:
            if c[_CERT_UNPLACED] == bump.unplaced_before:
                c[_CERT_UNPLACED] = bump.unplaced_before + 1
        chained = self._slots[bump.slots] == bump.slot_before
        self._slots[bump.slots[chained]] = bump.slot_before[chained] + np.uint64(1)
        if c[_CERT_WRITES] == bump.writes_before:
            c[_CERT_WRITES] = bump.writes_before + 1

    def invalidate(self) -> None:
        """Nothing is certified (before the hot tier is cleared and refilled)."""
        self._c[_EPOCH_PID] = 0
        self._c[_EPOCH_STARTED] = 0

    def certify_all(self, snap: Snapshot, epoch: tuple[int, int], *, consistent: bool = False) -> bool:
        """The hot tier was made to match the cold tier as it stood at `snap` (taken before the cold tier was read):
        certify everything at `snap`. A snapshot taken with the log (ColdStore.log_snapshot: `consistent`) counts
        no write whose record the cold read missed, and any write since shows as a newer generation; another one
        might, so it certifies only when no write came since (a certificate must never claim a write the hot tier
        did not see). The instance is written last, so no reader takes the new words for the old instance's."""
        if not consistent and self._g[WORD_WRITES] != snap.writes:
            return False
        self._slots[:] = snap.slots
        self._c[_CERT_UNPLACED] = snap.unplaced
        self._c[_CERT_WRITES] = snap.writes
        self._c[_EPOCH_PID], self._c[_EPOCH_STARTED] = epoch
        return True

    def certify_slot(self, slot: int, generation: int, unplaced: int, writes: int, epoch: tuple[int, int], *,
                     consistent: bool = False) -> bool:
        """Slot `slot` was repaired against the cold tier at (generation, unplaced), read before it was: certify it
        (with a `consistent` snapshot, as certify_all says; else only if no write to it came since); the whole store
        too once no slot is stale (writes: read before the repair)."""
        g = self._g
        if not self.epoch_matches(epoch) or self._c[_CERT_UNPLACED] != unplaced:
            return False
        if not consistent and (g[FIRST_SLOT_WORD + slot] != generation or g[WORD_UNPLACED] != unplaced):
            return False
        self._slots[slot] = generation
        if self._c[_CERT_WRITES] != writes and g[WORD_WRITES] == writes and self.stale_slots().size == 0:
            self._c[_CERT_WRITES] = writes
        return True

    def close(self) -> None:
        """Unmaps the file; closing again does nothing."""
        if getattr(self, "_mm", None) is None:
            return
        self._c.release()
        del self._slots
        self._mm.close()
        self._mm = None


def _refresh(hot, cold, ids: np.ndarray) -> None:
    """Hot rows `ids` become exact copies of the cold tier's (vector, namespace, time), or leave the hot tier where
    the cold tier no longer holds them."""
    if ids.size == 0:
        return
    rows = cold.vectors_of(ids)
    gone = np.setdiff1d(ids, rows["ids"])
    if gone.size:
        hot.delete(gone)
    if rows["ids"].size:
        hashes = np.array([namespace_hash(ns) for ns in rows["namespace"]], dtype=np.uint64)
        hot.upsert(rows["ids"], rows["vectors"], hashes, created_at_us=rows["created_at_us"])


def repair(hot, cold, certs: HotCertificates, epoch: tuple[int, int], slot: int | None) -> bool:
    """Brings the hot tier back in line with the cold tier for the namespaces of one generation slot (None, or no
    valid certificate of unplaced writes or of this sidecar instance: every namespace), publishes their totals,
    then certifies what it repaired; False when a write came meanwhile (the slot stays stale for a later repair).
    Call under the store's write lock. The counters are read before the cold tier is, so a certificate never
    covers a write the repair did not see."""
    gens = cold.generations
    full = slot is None or not certs.epoch_matches(epoch) or certs.certified_unplaced() != gens.unplaced()
    position, snap = cold.log_snapshot()
    table = hot.namespace_table()  # hash -> (hot rows, published total)
    cold_totals = {namespace_hash(ns): n for ns, n in cold.namespace_counts().items()}

    def in_scope(h: int) -> bool:
        return full or slot_of(h) == slot

    if full:
        _refresh(hot, cold, hot.list_ids())
    else:
        for h, (hot_rows, _) in table.items():
            if hot_rows and in_scope(h):
                _refresh(hot, cold, hot.list_ids(h))
    totals = {h: 0 for h in table if in_scope(h)}
    totals.update({h: n for h, n in cold_totals.items() if in_scope(h)})
    hot.set_namespace_totals(totals)
    consistent = position is not None
    if full:
        certified = certs.certify_all(snap, epoch, consistent=consistent)
        if certified and certs.applied() is None:
            certs.set_applied(position)  # the log's writes up to here are in what the repair read
        return certified
    return certs.certify_slot(slot, int(snap.slots[slot]), snap.unplaced, snap.writes, epoch, consistent=consistent)
