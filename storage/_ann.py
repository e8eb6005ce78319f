"""FAISS ANN index over the mirror's row positions: IVF-Flat by inner product, kept in step with every write,
saved beside the LanceDB table and reconciled against the mirror (never trusted blindly) when loaded.

Why IVF-Flat: it stores the float32 vectors themselves (scores are exact inner products), supports single-row
adds and removals (DirectMap hashtable), takes an IDSelectorBitmap for namespace/metadata filters inside the
search, and builds over 1M x 384 in a minute or two on 2 cores (HNSW needs tens of minutes there). The probe
count is tuned at build time on the store's own vectors for recall@10 >= the target, within a probe budget of a
quarter of the lists. When the budget does not reach the target (uniformly random vectors: no cluster structure to
exploit), or reaching it scans so many rows that IVF would be no faster than a flat scan, choose_method() says
"exact" and the store searches its mirror exactly instead (the choice is saved in choice.json and re-made at the
next build, e.g. when the store has grown).

Labels are mirror positions (dense, so a filter is a packed bitmap); the mirror tells this index about every
added or removed position and every repack (listener hooks).
"""
from __future__ import annotations

import json
import math
import os
import time
import zlib
from typing import Iterator

import numpy as np

FORMAT = 1
KIND = "ivf_flat"
META_FILE = "meta.json"
TARGET_RECALL = 0.97  # tuned on the store's own vectors with a margin over the 0.95 goal
CHOICE_FILE = "choice.json"
# Probe budget of the tuner: at most this fraction of the lists.
MAX_SCAN_FRACTION = 0.25
# An IVF-Flat probe costs about 1.4-1.7x a flat (IndexFlatIP) scan per row scanned, one thread, batch-1
# (100k x 384 random, 512 lists: nprobe 128 = 25% of rows 3.8 ms, 256 = 50% 6.7 ms, 512 = 100% 13.0 ms, flat 9.0 ms).
IVF_ROW_COST = 1.5
# IVF is kept only when its expected cost is at most this fraction of exact search's (else exact is as fast or
# faster and has no recall loss).
MAX_COST_RATIO = 0.5
_BAD_LABEL_BASE = 1 << 60  # labels parked here are removed in one range removal


def faiss():
    """The faiss module, imported when first needed rather than with this module."""
    import faiss as _faiss
    return _faiss


def set_threads(n: int) -> None:
    """OpenMP threads for FAISS calls made by this OS thread (libgomp keeps this per thread)."""
    faiss().omp_set_num_threads(max(1, int(n)))


def build_threads() -> int:
    """OpenMP threads for training, tuning and large adds: one per core."""
    return max(1, os.cpu_count() or 1)


def choose_method(tuned_recall: float | None, nprobe: int, nlist: int, scan_fraction: float | None,
                  target: float) -> tuple[str, str]:
    """("ivf" or "exact", why) for an IVF index tuned to `tuned_recall` at `nprobe` of `nlist` lists, scanning
    `scan_fraction` of the rows per query (nprobe/nlist when unknown)."""
    scan = float(nprobe) / max(1, nlist) if scan_fraction is None else float(scan_fraction)
    if tuned_recall is None:
        return "ivf", f"nprobe {nprobe}/{nlist} (recall not tuned)"
    if tuned_recall < target:
        return "exact", (f"IVF recall@10 {tuned_recall:.3f} at nprobe {nprobe}/{nlist} (the probe budget) is below "
                         f"the target {target:.2f}; searching exactly")
    if IVF_ROW_COST * scan > MAX_COST_RATIO:
        return "exact", (f"IVF reaches recall@10 {tuned_recall:.3f} only at nprobe {nprobe}/{nlist} (scanning "
                         f"{scan:.0%} of the rows): no faster than exact search; searching exactly")
    return "ivf", f"IVF recall@10 {tuned_recall:.3f} at nprobe {nprobe}/{nlist}, scanning {scan:.1%} of the rows"


def flat_search(vectors: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k best inner products of `query` ((dim,) float32) over every row of `vectors` ((n, dim)
    float32, C-contiguous: no copy), by a FAISS flat scan on one thread (the exact fallback when IVF loses)."""
    f = faiss()
    set_threads(1)
    _, labels = f.knn(query.reshape(1, -1), vectors, int(min(k, vectors.shape[0])), metric=f.METRIC_INNER_PRODUCT)
    labels = labels[0]
    return labels[labels >= 0]


def choose_nlist(n: int) -> int:
    """About 2*sqrt(n) lists, a power of two, at least ~39 training points per list."""
    target = max(16.0, 2.0 * math.sqrt(max(n, 1)))
    nlist = 1 << int(round(math.log2(target)))
    while nlist > 16 and nlist * 39 > n:
        nlist //= 2
    return max(1, min(nlist, 16384))


class IvfAnn:
    """IndexIVFFlat (METRIC_INNER_PRODUCT) with labels = mirror positions."""

    def __init__(self, index, *, nprobe: int, trained_rows: int, tuned_recall: float | None):
        self.index = index
        self.dim = int(index.d)
        self.nlist = int(index.nlist)
        self.nprobe = int(nprobe)
        self.trained_rows = int(trained_rows)
        self.tuned_recall = tuned_recall
        self.scan_fraction: float | None = None  # mean fraction of the rows one query scans at nprobe (tuned)
        self.probe_budget: int | None = None  # the largest nprobe the tuner would try
        self.changes = 0  # writes applied since the last save

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def train(cls, sample: np.ndarray, *, nlist: int, trained_rows: int, seed: int = 0) -> "IvfAnn":
        """An empty index of `nlist` lists trained on `sample` ((m, dim) float32); trained_rows records the store size
        it was built for. Starts untuned at nprobe min(16, nlist), with a hashtable direct map for single-row
        removals."""
        f = faiss()
        dim = sample.shape[1]
        quantizer = f.IndexFlatIP(dim)
        index = f.IndexIVFFlat(quantizer, dim, nlist, f.METRIC_INNER_PRODUCT)
        index.own_fields = True
        quantizer.this.disown()
        index.cp.niter = 12
        index.cp.seed = seed
        index.cp.max_points_per_centroid = 64
        set_threads(build_threads())
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
        index.set_direct_map_type(f.DirectMap.Hashtable)
        return cls(index, nprobe=min(16, nlist), trained_rows=trained_rows, tuned_recall=None)

    @property
    def ntotal(self) -> int:
        """Entries the index holds."""
        return int(self.index.ntotal)

    # ---- changes (MirrorListener) ------------------------------------------------------------
    def add(self, positions: np.ndarray, vectors: np.ndarray) -> None:
        """Adds vectors ((m, dim) float32) labelled by their mirror positions ((m,) int64)."""
        if positions.shape[0] == 0:
            return
        set_threads(1 if positions.shape[0] < 256 else build_threads())
        self.index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32),
                                np.ascontiguousarray(positions, dtype=np.int64))
        self.changes += int(positions.shape[0])

    def remove(self, positions: np.ndarray) -> None:
        """Removes the entries labelled by these mirror positions."""
        if positions.shape[0] == 0:
            return
        f = faiss()
        arr = np.ascontiguousarray(positions, dtype=np.int64)
        set_threads(1)
        self.index.remove_ids(f.IDSelectorArray(arr.shape[0], f.swig_ptr(arr)))
        self.changes += int(arr.shape[0])

    on_add = add
    on_remove = remove

    def on_repack(self, new_of_old: np.ndarray) -> None:
        """Positions moved: relabel every stored entry in place (all labels here are live rows)."""
        f = faiss()
        self.index.set_direct_map_type(f.DirectMap.NoMap)
        for list_no, labels, codes in self._lists():
            new = new_of_old[labels]
            bad = new < 0
            if bad.any():  # cannot happen if the index was in step; park for removal rather than trust it
                new[bad] = _BAD_LABEL_BASE + np.arange(int(bad.sum()))
            self._update_list(list_no, new, codes)
        self._remove_parked()
        self.index.set_direct_map_type(f.DirectMap.Hashtable)
        self.changes += 1

    # ---- search ------------------------------------------------------------------------------
    def search(self, query: np.ndarray, k: int, *, nprobe: int | None = None,
               bitmap: np.ndarray | None = None) -> np.ndarray:
        """Candidate positions (best first) for one query ((dim,) float32); fewer than k when the index (or the
        filter) holds fewer."""
        f = faiss()
        set_threads(1)  # batch-1 queries are 2-6x faster on one thread than two on a 2-core machine
        probes = max(1, min(self.nlist, int(nprobe or self.nprobe)))
        if bitmap is not None:
            sel = f.IDSelectorBitmap(bitmap.shape[0] * 8, f.swig_ptr(bitmap))
            params = f.SearchParametersIVF(sel=sel, nprobe=probes)
        else:
            params = f.SearchParametersIVF(nprobe=probes)
        _, labels = self.index.search(query.reshape(1, -1), int(k), params=params)
        labels = labels[0]
        return labels[labels >= 0]

    def tune(self, vectors: np.ndarray, live: np.ndarray, *, target: float = TARGET_RECALL, queries: int = 100,
             max_scan_fraction: float = MAX_SCAN_FRACTION, seed: int = 0) -> None:
        """Smallest probe count whose recall@10 on the store's own vectors (self excluded) reaches `target`, within
        a budget of `max_scan_fraction` of the lists; probes double from 1, so the answer is within 2x of the
        minimum. Also records the mean fraction of rows scanned per query at that count (from the probed lists'
        sizes), for choose_method()."""
        if live.shape[0] <= 11:
            self.nprobe, self.tuned_recall, self.scan_fraction, self.probe_budget = self.nlist, 1.0, 1.0, self.nlist
            return
        rng = np.random.default_rng(seed)
        qpos = rng.choice(live, size=min(queries, live.shape[0]), replace=False)
        q = np.ascontiguousarray(vectors[qpos])
        set_threads(build_threads())
        # Exact truth by blocks: top 11 (self included) over every live row.
        best_s = np.full((q.shape[0], 11), -np.inf, np.float32)
        best_p = np.zeros((q.shape[0], 11), np.int64)
        for lo in range(0, live.shape[0], 65536):
            block = live[lo:lo + 65536]
            s = q @ vectors[block].T
            s_all = np.concatenate([best_s, s], axis=1)
            p_all = np.concatenate([best_p, np.broadcast_to(block, s.shape)], axis=1)
            top = np.argpartition(-s_all, 10, axis=1)[:, :11]
            best_s = np.take_along_axis(s_all, top, 1)
            best_p = np.take_along_axis(p_all, top, 1)
        order = np.argsort(-best_s, axis=1, kind="stable")
        truth = [set([int(x) for x in row if x != p][:10]) for row, p in zip(np.take_along_axis(best_p, order, 1), qpos)]
        cap = max(1, min(self.nlist, int(np.ceil(self.nlist * max_scan_fraction))))
        f = faiss()
        invlists = self.index.invlists
        sizes = np.array([invlists.list_size(i) for i in range(self.nlist)], np.int64)
        total = max(1, int(sizes.sum()))
        recall, scan, probes = 0.0, 0.0, 1
        while True:
            _, lab = self.index.search(q, 11, params=f.SearchParametersIVF(nprobe=probes))
            hits = sum(len(t & set([int(x) for x in row if x != p][:10])) for t, row, p in zip(truth, lab, qpos))
            recall = hits / max(1, sum(len(t) for t in truth))
            _, probed = self.index.quantizer.search(q, probes)
            scan = float(sizes[probed[probed >= 0]].sum()) / (q.shape[0] * total)
            if recall >= target or probes >= cap or IVF_ROW_COST * scan > MAX_COST_RATIO:
                break  # reached, out of budget, or already no faster than exact search
            probes = min(cap, probes * 2)
        self.nprobe, self.tuned_recall, self.scan_fraction, self.probe_budget = int(probes), float(recall), scan, cap

    def choice(self, target: float) -> tuple[str, str]:
        """choose_method() for this index as tuned: ("ivf" or "exact", why)."""
        return choose_method(self.tuned_recall, self.nprobe, self.nlist, self.scan_fraction, target)

    # ---- inspection ---------------------------------------------------------------------------
    def _lists(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(list number, labels copy, vectors copy (m, dim)) for every non-empty inverted list."""
        f = faiss()
        invlists = self.index.invlists
        for list_no in range(self.nlist):
            size = invlists.list_size(list_no)
            if size == 0:
                continue
            labels = f.rev_swig_ptr(invlists.get_ids(list_no), size).copy()
            codes = f.rev_swig_ptr(invlists.get_codes(list_no), size * self.index.code_size).copy()
            yield list_no, labels, codes.view(np.float32).reshape(size, self.dim)

    def _update_list(self, list_no: int, labels: np.ndarray, codes: np.ndarray) -> None:
        f = faiss()
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        raw = np.ascontiguousarray(codes).view(np.uint8)
        self.index.invlists.update_entries(list_no, 0, labels.shape[0], f.swig_ptr(labels), f.swig_ptr(raw))

    def _remove_parked(self) -> int:
        f = faiss()
        return int(self.index.remove_ids(f.IDSelectorRange(_BAD_LABEL_BASE, np.iinfo(np.int64).max)))

    def reconcile(self, label_ids: np.ndarray, mirror) -> dict:
        """Make this index hold exactly the mirror's live rows, given what each stored label meant (`label_ids`:
        label -> row id, -1 unknown). Entries whose id is gone or whose stored vector differs from the mirror's
        are dropped, the others relabelled to the id's current position, and missing live rows added."""
        f = faiss()
        self.index.set_direct_map_type(f.DirectMap.NoMap)
        new_pos = mirror.positions_or_minus1(label_ids) if label_ids.shape[0] else np.empty(0, np.int64)
        seen = np.zeros(mirror.n, bool)
        kept = dropped = 0
        all_vectors = mirror.all_vectors()
        for list_no, labels, codes in self._lists():
            valid = (labels >= 0) & (labels < new_pos.shape[0])
            target = np.full(labels.shape[0], -1, np.int64)
            target[valid] = new_pos[labels[valid]]
            ok = target >= 0
            if ok.any():
                idx = np.flatnonzero(ok)
                same = (codes[idx] == all_vectors[target[idx]]).all(axis=1)
                ok[idx[~same]] = False
                idx = idx[same]
                # One entry per position: a duplicate (can only come from a damaged file) is dropped.
                uniq, first = np.unique(target[idx], return_index=True)
                dup = np.setdiff1d(np.arange(idx.shape[0]), first)
                ok[idx[dup]] = False
                already = seen[uniq]
                ok[idx[first[already]]] = False
                seen[uniq] = True
            bad = ~ok
            new = target.copy()
            new[bad] = _BAD_LABEL_BASE + np.arange(int(bad.sum()))
            kept += int(ok.sum())
            dropped += int(bad.sum())
            self._update_list(list_no, new, codes)
        if dropped:
            self._remove_parked()
        missing = np.flatnonzero(mirror.alive_mask() & ~seen)
        for lo in range(0, missing.shape[0], 65536):
            part = missing[lo:lo + 65536]
            self.add(part, all_vectors[part])
        self.index.set_direct_map_type(f.DirectMap.Hashtable)
        return {"kept": kept, "dropped": dropped, "added": int(missing.shape[0])}

    # ---- persistence ---------------------------------------------------------------------------
    def serialize(self) -> np.ndarray:
        """The index as bytes (a uint8 array) for write()."""
        return faiss().serialize_index(self.index)

    @staticmethod
    def write(folder: str, blob: np.ndarray, label_ids: np.ndarray, meta: dict) -> None:
        """Write a new generation (index bytes, label -> id map) and then publish it by replacing meta.json
        atomically; a reader sees the old generation or the new one, never a mix. Call under the save lock."""
        os.makedirs(folder, mode=0o700, exist_ok=True)
        gen = f"{time.time_ns():x}-{os.getpid()}"
        index_name, labels_name = f"index-{gen}.faiss", f"labels-{gen}.npy"
        label_bytes = np.ascontiguousarray(label_ids, dtype="<i8").tobytes()
        for name, data in ((index_name, memoryview(blob)), (labels_name, label_bytes)):
            _write_durable(os.path.join(folder, name), data)
        meta = {**meta, "format": FORMAT, "kind": KIND, "index_file": index_name, "labels_file": labels_name,
                "index_bytes": int(blob.nbytes), "index_crc32": zlib.crc32(memoryview(blob)),
                "labels_count": int(label_ids.shape[0]), "labels_crc32": zlib.crc32(label_bytes)}
        tmp = os.path.join(folder, f".{META_FILE}.{gen}.tmp")
        _write_durable(tmp, json.dumps(meta).encode())
        os.replace(tmp, os.path.join(folder, META_FILE))
        _fsync_dir(folder)
        for name in os.listdir(folder):  # older generations and stray temporaries
            if name not in (index_name, labels_name, META_FILE) and (name.startswith(("index-", "labels-", f".{META_FILE}"))):
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    pass

    @classmethod
    def read(cls, folder: str, dim: int) -> tuple["IvfAnn", np.ndarray, dict]:
        """Load the published generation; raises ValueError (with the reason) when anything does not check out."""
        try:
            with open(os.path.join(folder, META_FILE), "rb") as fh:
                meta = json.loads(fh.read())
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(f"unreadable {META_FILE}: {exc}") from exc
        if meta.get("format") != FORMAT or meta.get("kind") != KIND or meta.get("dim") != dim:
            raise ValueError(f"index format/kind/dim {meta.get('format')}/{meta.get('kind')}/{meta.get('dim')} "
                             f"is not {FORMAT}/{KIND}/{dim}")
        with open(os.path.join(folder, meta["index_file"]), "rb") as fh:
            raw = fh.read()
        if len(raw) != meta["index_bytes"] or zlib.crc32(raw) != meta["index_crc32"]:
            raise ValueError("index file size or checksum does not match its meta.json")
        with open(os.path.join(folder, meta["labels_file"]), "rb") as fh:
            label_bytes = fh.read()
        if zlib.crc32(label_bytes) != meta["labels_crc32"] or len(label_bytes) != 8 * meta["labels_count"]:
            raise ValueError("labels file size or checksum does not match its meta.json")
        f = faiss()
        index = f.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
        if not isinstance(index, f.IndexIVFFlat) or index.d != dim or index.metric_type != f.METRIC_INNER_PRODUCT:
            raise ValueError(f"stored index is {type(index).__name__} d={index.d}, expected IndexIVFFlat d={dim}")
        ann = cls(index, nprobe=int(meta["nprobe"]), trained_rows=int(meta["trained_rows"]),
                  tuned_recall=meta.get("tuned_recall"))
        return ann, np.frombuffer(label_bytes, dtype="<i8").astype(np.int64), meta


def write_choice(folder: str, choice: dict) -> None:
    """Publish an "exact" choice (no index files): a reopened store then searches exactly without rebuilding until
    it has grown past what the choice was made for. Call under the save lock."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = os.path.join(folder, f".{CHOICE_FILE}.{time.time_ns():x}-{os.getpid()}.tmp")
    _write_durable(tmp, json.dumps({**choice, "format": FORMAT}).encode())
    os.replace(tmp, os.path.join(folder, CHOICE_FILE))
    for name in os.listdir(folder):  # an older IVF generation must not be loaded in its place
        if name.startswith(("index-", "labels-", META_FILE, f".{META_FILE}")):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass
    _fsync_dir(folder)


def read_choice(folder: str) -> dict | None:
    """The saved choice, or None when absent or unreadable (then the saved index, if any, decides)."""
    try:
        with open(os.path.join(folder, CHOICE_FILE), "rb") as fh:
            choice = json.loads(fh.read())
    except Exception:
        return None
    return choice if isinstance(choice, dict) and choice.get("format") == FORMAT else None


def remove_choice(folder: str) -> None:
    """Removes a saved choice (absent: nothing), once an IVF index is in use again."""
    try:
        os.unlink(os.path.join(folder, CHOICE_FILE))
    except OSError:
        pass


def _write_durable(path: str, data) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data).cast("B")
        while view:
            written = os.write(fd, view[: 1 << 26])
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
