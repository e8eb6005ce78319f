"""The FAISS index's life cycle in a cold store: load and reconcile the saved one, build, save, exact or IVF."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ._ann import IvfAnn, choose_method, choose_nlist, read_choice, remove_choice, write_choice
from ._lifecycle import Lifecycle
from ._maintenance import maintenance_lock
from ._mirror import VectorMirror

if TYPE_CHECKING:
    from ._follower import Follower

FAISS_FOLDER = "faiss_index"
_SAVE_LOCK_NAME = ".faiss.lock"  # across processes: one writer of the index files at a time
_BUILD_ATTEMPTS = 3
_ADD_BLOCK = 65536
logger = logging.getLogger(__name__)


def search_path_name(mode: str, mirror_rows: int | None, has_faiss: bool, vector_index: str | None) -> str:
    """The search path stats() reports: LanceDB (its ANN index and a re-rank, or exact) without a mirror or with
    mode "lancedb"; FAISS IVF and a re-rank when an index is in use under mode "auto"; else exact over the mirror."""
    if mirror_rows is None or mode == "lancedb":
        return "lancedb-ann+rerank" if vector_index else "lancedb-exact"
    return "faiss-ivf+rerank" if has_faiss and mode == "auto" else "mirror-exact"


class FaissIndex:
    """Owns the IVF index over the mirror's positions (`ann`; None: search exactly), where it came from, the background
    build thread, the exact-vs-IVF choice and the build figures. The mirror tells `ann` of every position it adds,
    removes or moves (its listener); the follower tells this part of every new mirror (mirror_replaced). Methods named
    *_locked run under the store's lock."""

    def __init__(self, follower: "Follower", *, lock: threading.RLock, life: Lifecycle, path: str, dim: int,
                 read_only: bool, mode: str, min_rows: int, target_recall: float) -> None:
        self._follower = follower
        self._lock = lock
        self._life = life
        self._path = path
        self._folder = os.path.join(path, FAISS_FOLDER)
        self._dim = dim
        self._read_only = read_only
        self._mode = mode
        self._min_rows = min_rows
        self._target_recall = target_recall
        self.ann: IvfAnn | None = None
        self.source = "none"
        self.builds = 0
        self.last_build_s: float | None = None
        self.last_reconcile: dict | None = None
        self.error: str | None = None
        self.choice: dict | None = None  # the last build's (or the saved) choice: method, why, tuned recall
        self._thread: threading.Thread | None = None
        self._save_lock = threading.Lock()
        self._opening = True  # no background build before the saved index had its chance

    # ---- the follower's news (MirrorWatcher) ---------------------------------------------------
    def mirror_replaced(self, old: VectorMirror | None, new: VectorMirror | None) -> None:
        """Without a mirror (past its budget) drops the index; else keeps it over the reloaded mirror (reconciled to
        the new positions) and schedules a build if one is due."""
        if new is None:
            self.ann = None  # past the mirror's budget: LanceDB serves searches
            return
        if self.ann is not None and old is not None:
            # Another process moved rows: keep the index, relabelled to the new positions and repaired.
            ann, self.ann = self.ann, None
            try:
                self.last_reconcile = ann.reconcile(old.label_ids(), new)
                new.listener = ann
                self.ann = ann
            except Exception as exc:
                self.error = f"reconcile after reload: {type(exc).__name__}: {exc}"
        self.schedule_locked()

    def mirror_grew(self) -> None:
        """Schedules a build if the mirror has grown enough for one."""
        self.schedule_locked()

    # ---- choosing --------------------------------------------------------------------------------
    def _wanted_locked(self) -> bool:
        m = self._follower.mirror
        if self._life.closed or self._opening or self._mode != "auto" or m is None or m.live_rows < self._min_rows:
            return False
        # (Re)train when the store has grown 4x past what the lists were trained for (nlist ~ 2 sqrt(n)).
        if self.ann is not None:
            return m.live_rows > 4 * self.ann.trained_rows
        choice = self.choice
        if choice is not None and choice.get("method") == "exact" and choice.get("target_recall") == self._target_recall:
            return m.live_rows > 4 * int(choice.get("rows", 0))  # IVF lost to exact search at this size: re-made later
        return True

    def schedule_locked(self) -> None:
        """Starts the background build thread when a build is due and none is running."""
        if self._thread is None and self._wanted_locked():
            self._thread = threading.Thread(target=self._build_worker, name=f"cold-faiss-build:{self._path}",
                                            daemon=True)
            self._thread.start()

    def exact_by_choice(self) -> bool:
        """Past faiss_min_rows, but IVF missed the recall target or was no faster: a flat scan answers."""
        choice, m = self.choice, self._follower.mirror
        return (self._mode == "auto" and choice is not None and choice.get("method") == "exact"
                and m is not None and m.live_rows >= self._min_rows)

    def _choice_record(self, ann: IvfAnn, method: str, why: str) -> dict:
        return {"method": method, "reason": why, "tuned_recall": ann.tuned_recall, "target_recall": self._target_recall,
                "nprobe": ann.nprobe, "nlist": ann.nlist, "probe_budget": ann.probe_budget,
                "scan_fraction": ann.scan_fraction, "rows": ann.trained_rows, "dim": self._dim}

    def _adopt_exact_locked(self, choice: dict, *, source: str) -> None:
        """Search exactly (no FAISS index) because IVF missed the recall target or would be no faster."""
        m = self._follower.mirror
        if self.ann is not None and m is not None and m.listener is self.ann:
            m.listener = None
        self.ann = None
        self.source = source
        self.choice = dict(choice)
        logger.warning("cold store %s: exact search over %d rows instead of FAISS IVF: %s", self._path,
                       m.live_rows if m is not None else -1, choice.get("reason"))

    def _publish_exact(self, choice: dict) -> None:
        """Save an "exact" choice: a reopened store then searches exactly without building first."""
        with maintenance_lock(self._path, blocking=True, name=_SAVE_LOCK_NAME):
            write_choice(self._folder, {**choice, "table_version": self._follower.mirror_version,
                                        "saved_at": time.time()})

    # ---- the saved index -------------------------------------------------------------------------
    def open_saved_locked(self) -> None:
        """Once the mirror is loaded: load the saved index and reconcile it with the rows (it is a cache: never
        trusted blindly), or the saved exact choice; then build in the background if one is due."""
        self._opening = False
        m = self._follower.mirror
        if self._mode != "auto" or m is None or m.live_rows < self._min_rows:
            return
        choice = read_choice(self._folder)
        if (choice is not None and choice.get("method") == "exact" and choice.get("dim") == self._dim
                and choice.get("target_recall") == self._target_recall and m.live_rows <= 4 * int(choice.get("rows", 0))):
            self._adopt_exact_locked(choice, source="loaded")
        else:
            self._load_saved_locked(m)
        self.schedule_locked()

    def _load_saved_locked(self, m: VectorMirror) -> None:
        try:
            ann, label_ids, meta = IvfAnn.read(self._folder, self._dim)
        except FileNotFoundError:
            self.source = "none"
            return
        except Exception as exc:
            self.source = "rejected"
            self.error = f"saved index rejected ({type(exc).__name__}: {exc}); rebuilding from LanceDB"
            return
        ann.scan_fraction, ann.probe_budget = meta.get("scan_fraction"), meta.get("probe_budget")
        method, why = choose_method(ann.tuned_recall, ann.nprobe, ann.nlist, ann.scan_fraction, self._target_recall)
        if method == "exact":  # saved by an older version (or for another target): not used, not loaded again
            choice = self._choice_record(ann, method, why)
            del ann
            self._adopt_exact_locked(choice, source="loaded")
            if not self._read_only:
                try:
                    self._publish_exact(choice)
                except OSError:
                    pass  # a read-only folder: the saved index is judged again on the next open
            return
        try:
            report = ann.reconcile(label_ids, m)
        except Exception as exc:
            self.source = "rejected"
            self.error = f"saved index failed reconciliation ({type(exc).__name__}: {exc}); rebuilding"
            return
        fresh = (meta.get("table_version") == self._follower.mirror_version and meta.get("rows") == m.live_rows
                 and report["dropped"] == 0 and report["added"] == 0)
        self.source = "loaded" if fresh else "repaired"
        self.last_reconcile = report
        ann.changes = 0 if fresh else max(1, report["dropped"] + report["added"])
        m.listener = ann
        self.ann = ann
        self.choice = self._choice_record(ann, method, why)

    def save(self, *, force: bool) -> bool:
        """Publish the FAISS index beside the table (stamped with the table version it matches). Serialised under
        the store lock (a memory copy), written to disk outside it."""
        if self._life.closed or self._read_only:
            return False
        with self._save_lock:
            with self._lock:
                ann, m = self.ann, self._follower.mirror
                if ann is None or m is None or ann.changes == 0:
                    return False
                if not force and ann.changes < max(1000, m.live_rows // 20):
                    return False
                blob = ann.serialize()
                label_ids = m.label_ids()
                meta = {"dim": self._dim, "table_version": self._follower.mirror_version, "rows": m.live_rows,
                        "nprobe": ann.nprobe, "trained_rows": ann.trained_rows, "tuned_recall": ann.tuned_recall,
                        "scan_fraction": ann.scan_fraction, "probe_budget": ann.probe_budget,
                        "target_recall": self._target_recall, "saved_at": time.time()}
                ann.changes = 0
            with maintenance_lock(self._path, blocking=True, name=_SAVE_LOCK_NAME):
                IvfAnn.write(self._folder, blob, label_ids, meta)
                remove_choice(self._folder)  # an IVF index is in use again
            return True

    # ---- building --------------------------------------------------------------------------------
    def _build_worker(self) -> None:
        try:
            self.build()
        except Exception as exc:  # a failed build leaves exact search in place; stats() reports it
            self.error = f"build: {type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._thread = None

    def build(self) -> None:
        """Train and fill a new IVF index from a snapshot of the mirror without holding the lock, then catch up
        with the writes made meanwhile and swap it in (positions are append-only between repacks)."""
        for _ in range(_BUILD_ATTEMPTS):
            with self._lock:
                if not self._wanted_locked():
                    return
                m = self._follower.mirror
                epoch, n_snap = m.epoch, m.n
                positions = m.live_positions()
                vectors = m.all_vectors()  # rows below n_snap are never rewritten in place; a repack bumps epoch
            t0 = time.perf_counter()
            ann = self._train(positions, vectors)
            method, why = ann.choice(self._target_recall)
            if method == "exact":
                choice = self._choice_record(ann, method, why)
                del ann
                self._settle_on_exact(choice, t0)
                return
            with self._lock:
                if self._life.closed:
                    return
                if self._follower.mirror is not m or m.epoch != epoch:
                    continue  # positions moved while building: build again from the new snapshot
                ann.remove(positions[~m.alive_at(positions)])
                new = m.live_positions(n_snap)
                ann.add(new, m.vectors_at(new))
                ann.changes = max(1, ann.changes)
                m.listener = ann
                self.ann = ann
                self.choice = self._choice_record(ann, method, why)
                self.source = "built"
                self.builds += 1
                self.last_build_s = time.perf_counter() - t0
            self.save(force=True)
            return

    def _train(self, positions: np.ndarray, vectors: np.ndarray) -> IvfAnn:
        nlist = choose_nlist(positions.shape[0])
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(positions, size=min(positions.shape[0], 64 * nlist), replace=False))
        ann = IvfAnn.train(vectors[sample], nlist=nlist, trained_rows=positions.shape[0])
        for lo in range(0, positions.shape[0], _ADD_BLOCK):
            part = positions[lo:lo + _ADD_BLOCK]
            ann.add(part, vectors[part])
        ann.tune(vectors, positions, target=self._target_recall)
        return ann

    def _settle_on_exact(self, choice: dict, t0: float) -> None:
        with self._lock:
            if self._life.closed:
                return
            self._adopt_exact_locked(choice, source="built")
            self.builds += 1
            self.last_build_s = time.perf_counter() - t0
        if not self._read_only:
            with self._save_lock:
                self._publish_exact(choice)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no FAISS build is running."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    # ---- reporting and closing -------------------------------------------------------------------
    def search_path(self, mirror_rows: int | None, vector_index: str | None) -> str:
        """The search path stats() reports, "faiss-flat-exact" where IVF lost to exact search (search_path_name)."""
        if self.ann is None and mirror_rows is not None and self.exact_by_choice():
            return "faiss-flat-exact"
        return search_path_name(self._mode, mirror_rows, self.ann is not None, vector_index)

    def figures(self) -> dict:
        """The index and build figures for ColdStore.stats(): the index itself, its source, builds, errors and the
        exact-vs-IVF choice."""
        ann = self.ann
        return {
            "faiss": None if ann is None else {
                "kind": "ivf_flat", "rows": ann.ntotal, "nlist": ann.nlist, "nprobe": ann.nprobe,
                "trained_rows": ann.trained_rows, "tuned_recall": ann.tuned_recall, "source": self.source,
                "unsaved_changes": ann.changes, "scan_fraction": ann.scan_fraction},
            "faiss_source": self.source,
            "faiss_builds": self.builds,
            "faiss_building": self._thread is not None,
            "faiss_last_build_s": self.last_build_s,
            "faiss_last_reconcile": self.last_reconcile,
            "faiss_error": self.error,
            # Why the default search is exact or IVF past faiss_min_rows: method, reason, tuned_recall, nprobe, ...
            "faiss_choice": None if self.choice is None else dict(self.choice),
        }

    def stop(self) -> None:
        """At close: a build in flight finishes (it cannot be interrupted inside FAISS) and is then dropped; the index
        is saved (a cache: on failure the next open rebuilds or repairs it)."""
        thread = self._thread
        if thread is not None:
            thread.join()
        try:
            self.save(force=True)
        except Exception:
            pass

    def drop(self) -> None:
        """Forgets the index (at close)."""
        self.ann = None
