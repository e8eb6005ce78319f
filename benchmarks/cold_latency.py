"""Cold-tier search latency and recall at scale: the default cold search (FAISS IVF over the LanceDB table, exact
re-scoring) against LanceDB flat, LanceDB's own IVF_PQ index and FAISS exact, on the same rows and queries; plus
single-row adds (p50/p99) and search latency after them vs a freshly compacted store.

    .venv/bin/python benchmarks/cold_latency.py --quick                       # 20k/50k rows, minutes
    .venv/bin/python benchmarks/cold_latency.py --rows 100000 1000000 --datasets clustered random locomo \\
        --json results/cold_latency.json --png results/cold_latency.png

Datasets: `clustered` (a Gaussian mixture with --centres centres on the unit sphere, queries drawn near the
centres), `random` (uniform unit vectors: the worst case for any ANN index, reported, not held to the target),
`locomo` (the LoCoMo turns from ../shared/data/locomo embedded with WordLlama; also R@10 of the evidence turns for
vector, BM25 and hybrid search). Batch-1 queries, one at a time; FAISS runs on one OpenMP thread for them.
recall@10 is measured against exact search over the same rows.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall.testing.locomo import load_questions  # the recall benchmark's evidence normalisation

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("LANCE_LOG", "error")  # LanceDB's per-query deprecation warnings would drown the table
os.environ.setdefault("RUST_LOG", "error")
LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


# ---- data --------------------------------------------------------------------------------------
def normalise(v: np.ndarray) -> np.ndarray:
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def clustered(rng: np.random.Generator, n: int, dim: int, centres: np.ndarray, sigma: float) -> np.ndarray:
    out = np.empty((n, dim), np.float32)
    for lo in range(0, n, 100_000):
        m = min(100_000, n - lo)
        block = centres[rng.integers(0, centres.shape[0], m)] + rng.standard_normal((m, dim), dtype=np.float32) * sigma
        out[lo:lo + m] = normalise(block)
    return out


def random_unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    out = np.empty((n, dim), np.float32)
    for lo in range(0, n, 100_000):
        m = min(100_000, n - lo)
        out[lo:lo + m] = normalise(rng.standard_normal((m, dim), dtype=np.float32))
    return out


def make_dataset(name: str, n: int, dim: int, n_queries: int, n_extra: int, centres_n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    if name == "clustered":
        centres = normalise(rng.standard_normal((centres_n, dim), dtype=np.float32))
        sigma = 0.6 / np.sqrt(dim)  # noise norm 0.6: a blob around each centre, neighbours mostly share it
        base = clustered(rng, n + n_extra, dim, centres, sigma)
        queries = clustered(rng, n_queries, dim, centres, sigma)
    else:
        base = random_unit(rng, n + n_extra, dim)
        queries = random_unit(rng, n_queries, dim)
    return base[:n], base[n:], queries


def exact_truth(matrix: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    import faiss
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    index = faiss.IndexFlatIP(matrix.shape[1])
    index.add(matrix)
    _, labels = index.search(queries, k)
    return labels


def recall_at(got: list[np.ndarray], truth: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(g[:k].tolist()) & set(t[:k].tolist())) / k for g, t in zip(got, truth)]))


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed(fn, queries: np.ndarray, warmup: int = 5) -> tuple[list[float], list[np.ndarray]]:
    for q in queries[:warmup]:
        fn(q)
    times, results = [], []
    for q in queries:
        t0 = time.perf_counter()
        ids = fn(q)
        times.append(time.perf_counter() - t0)
        results.append(np.asarray(ids))
    return times, results


def pct(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1e3, q))


def steady_p50(samples: list[float], blocks: int = 5) -> float:
    parts = np.array_split(np.asarray(samples), min(blocks, len(samples)))
    return float(min(np.median(p) for p in parts) * 1e3)


def rows_batch(ids: np.ndarray, vectors: np.ndarray, namespaces=None, texts=None) -> dict:
    n = ids.shape[0]
    return dict(ids=ids, vectors=vectors, namespaces=namespaces or ["default"] * n,
                texts=texts or [f"memory {i}" for i in ids.tolist()], sessions=[None] * n, roles=[None] * n,
                created_at_us=(ids * 1000).astype(np.int64), metadata=[None] * n)


def du_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total / 2**20


# ---- one dataset at one size ----------------------------------------------------------------------
def run_case(dataset: str, n: int, args, log) -> list[dict]:
    import faiss
    import lancedb
    from lancedb.index import IvfPq
    from tiered_recall.storage import ColdStore

    k = args.k
    n_extra = args.adds + args.baseline_adds
    base, extra, queries = make_dataset(dataset, n, args.dim, args.queries, n_extra, args.centres)
    truth = exact_truth(base, queries, k)
    results: list[dict] = []
    tag = f"{dataset} {n}x{args.dim}"

    def record(method: str, times, got, **extra_fields):
        row = {"dataset": dataset, "rows": n, "dim": args.dim, "method": method, "queries": len(times),
               "p50_ms": pct(times, 50), "p99_ms": pct(times, 99),
               "recall@10": recall_at(got, truth[: len(got)], k) if got is not None else None, **extra_fields}
        results.append(row)
        log(f"  {tag:22s} {method:34s} p50 {row['p50_ms']:8.3f} ms  p99 {row['p99_ms']:8.3f} ms  "
            f"recall@10 {row['recall@10'] if row['recall@10'] is None else round(row['recall@10'], 4)}  "
            + " ".join(f"{key}={val}" for key, val in extra_fields.items()))
        return row

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path = os.path.join(tmp, "cold")
        ids = np.arange(n, dtype=np.int64)
        # Bulk load with FAISS held back (so no background builds race the load), then one timed build.
        rss0 = rss_mb()
        t0 = time.perf_counter()
        store = ColdStore(path, dim=args.dim, faiss_min_rows=n + n_extra + 1, compact_every_s=3600.0)
        for lo in range(0, n, 50_000):
            store.add(**rows_batch(ids[lo:lo + 50_000], base[lo:lo + 50_000]))
        store.optimize()
        load_s = time.perf_counter() - t0
        rss_loaded = rss_mb()
        store._faiss_min_rows = args.faiss_min_rows  # the default threshold from here on
        t0 = time.perf_counter()
        store.build_index()
        build_s = time.perf_counter() - t0
        stats = store.stats()
        faiss_info = stats["faiss"] or {}
        choice = stats.get("faiss_choice") or {}
        log(f"  {tag}: loaded in {load_s:.1f} s; FAISS build {build_s:.1f} s {faiss_info}")
        log(f"  {tag}: default search {stats['search_path']}: {choice.get('reason')}")
        mem = {"mirror_mb": round(n * (args.dim * 4 + 24) / 2**20, 1),
               "faiss_mb": round(du_mb(os.path.join(path, "faiss_index")), 1), "rss_mb": round(rss_mb() - rss0, 1),
               "rss_after_load_mb": round(rss_loaded - rss0, 1)}

        # 1. the default cold search (what TieredMemory calls)
        times, got = timed(lambda q: store.search(q, k=k)[0], queries)
        record(f"cold default ({stats['search_path']})", times, [g for g in got], build_s=round(build_s, 2),
               nlist=choice.get("nlist"), nprobe=choice.get("nprobe"), choice=choice.get("method"),
               tuned_recall=choice.get("tuned_recall"), **mem)
        default_p50 = results[-1]["p50_ms"]

        # 2. FAISS exact (IndexFlatIP, one thread) over the same rows
        flat = faiss.IndexFlatIP(args.dim)
        t0 = time.perf_counter()
        flat.add(base)
        flat_build = time.perf_counter() - t0
        faiss.omp_set_num_threads(1)
        nq = args.queries if n <= 200_000 else min(args.queries, 100)
        times, got = timed(lambda q: flat.search(q.reshape(1, -1), k)[1][0], queries[:nq])
        record("FAISS exact (flat, 1 thread)", times, got, build_s=round(flat_build, 2),
               index_mb=round(n * args.dim * 4 / 2**20, 1))
        del flat
        gc.collect()

        # 3. numpy exact through the same store (index="exact" path): only at small sizes
        if n <= 200_000:
            store._index_mode = "exact"
            times, got = timed(lambda q: store.search(q, k=k)[0], queries[:nq])
            record("cold exact (numpy mirror)", times, got)
            store._index_mode = "auto"

        # 4. constant writes: single-row adds on top (durable on return: fdatasync'ed in the write-ahead log, moved
        # into LanceDB by the background flusher), then search right after them vs a freshly compacted store.
        if args.adds:
            add_times = []
            n_adds = args.adds
            extra_ids = np.arange(n, n + n_extra, dtype=np.int64)
            t_start = time.perf_counter()
            for j in range(n_adds):
                t0 = time.perf_counter()
                store.add(**rows_batch(extra_ids[j:j + 1], extra[j:j + 1]))
                add_times.append(time.perf_counter() - t0)
            adds_wall_s = time.perf_counter() - t_start
            # Straight after the last add: some rows are still in the log only, FAISS holds them all (incremental).
            all_vectors = np.concatenate([base, extra[:n_adds]])
            truth_after = exact_truth(all_vectors, queries, k)
            after_times, after_got = timed(lambda q: store.search(q, k=k)[0], queries)
            after_stats = store.stats()  # (flushes what the log still holds, then reads the table's figures)
            t0 = time.perf_counter()
            store.wait_for_index()
            store.optimize()
            optimize_s = time.perf_counter() - t0
            fresh_times, fresh_got = timed(lambda q: store.search(q, k=k)[0], queries)
            row = {"dataset": dataset, "rows": n, "dim": args.dim, "method": f"{n_adds} single-row adds (WAL)",
                   "add_p50_ms": pct(add_times, 50), "add_p99_ms": pct(add_times, 99),
                   "add_p999_ms": pct(add_times, 99.9), "add_max_ms": pct(add_times, 100),
                   "adds_per_s": round(n_adds / adds_wall_s, 1),
                   "search_after_adds_p50_ms": pct(after_times, 50),
                   "search_after_adds_p99_ms": pct(after_times, 99),
                   "search_after_adds_steady_p50_ms": steady_p50(after_times),
                   "search_after_adds_recall@10": recall_at(after_got, truth_after, k),
                   "search_compacted_p50_ms": pct(fresh_times, 50),
                   "search_compacted_p99_ms": pct(fresh_times, 99),
                   "search_compacted_steady_p50_ms": steady_p50(fresh_times),
                   "search_compacted_recall@10": recall_at(fresh_got, truth_after, k),
                   "optimize_s": round(optimize_s, 2),
                   "wal_flushes": after_stats["wal_flushes"], "wal_flushed_rows": after_stats["wal_flushed_rows"],
                   "wal_last_flush_s": after_stats["wal_last_flush_s"],
                   "fragments_after_adds": after_stats["fragments"], "versions_after_adds": after_stats["versions"],
                   "faiss_after_adds": after_stats["faiss"], "add_times_ms": [round(t * 1e3, 4) for t in add_times]}
            row["ratio_after_vs_compacted"] = row["search_after_adds_p50_ms"] / row["search_compacted_p50_ms"]
            row["ratio_after_vs_compacted_steady"] = (row["search_after_adds_steady_p50_ms"]
                                                      / row["search_compacted_steady_p50_ms"])
            results.append(row)
            log(f"  {tag:22s} adds: p50 {row['add_p50_ms']:.3f} ms p99 {row['add_p99_ms']:.3f} ms max "
                f"{row['add_max_ms']:.1f} ms ({row['adds_per_s']}/s, {row['wal_flushes']} flushes); search after "
                f"{row['search_after_adds_p50_ms']:.3f} ms (steady {row['search_after_adds_steady_p50_ms']:.3f}, "
                f"recall {row['search_after_adds_recall@10']:.4f}) vs compacted {row['search_compacted_p50_ms']:.3f} ms "
                f"(steady {row['search_compacted_steady_p50_ms']:.3f}); ratio p50 {row['ratio_after_vs_compacted']:.2f}"
                f", steady {row['ratio_after_vs_compacted_steady']:.2f}; fragments {row['fragments_after_adds']}")
            if args.baseline_adds:
                # The peer in the same run: the same store reopened with wal=False, every add its own LanceDB commit.
                store.close()
                store = ColdStore(path, dim=args.dim, faiss_min_rows=args.faiss_min_rows, compact_every_s=3600.0,
                                  wal=False)
                base_times = []
                for j in range(n_adds, n_adds + args.baseline_adds):
                    t0 = time.perf_counter()
                    store.add(**rows_batch(extra_ids[j:j + 1], extra[j:j + 1]))
                    base_times.append(time.perf_counter() - t0)
                brow = {"dataset": dataset, "rows": n, "dim": args.dim,
                        "method": f"{args.baseline_adds} single-row adds (commit each, wal=False)",
                        "add_p50_ms": pct(base_times, 50), "add_p99_ms": pct(base_times, 99),
                        "add_max_ms": pct(base_times, 100), "add_times_ms": [round(t * 1e3, 4) for t in base_times]}
                brow["ratio_commit_vs_wal_p50"] = brow["add_p50_ms"] / row["add_p50_ms"]
                results.append(brow)
                log(f"  {tag:22s} commit-per-add peer: p50 {brow['add_p50_ms']:.3f} ms p99 {brow['add_p99_ms']:.3f} ms"
                    f" ({brow['ratio_commit_vs_wal_p50']:.1f}x the WAL's p50)")
        store.close()
        del store
        gc.collect()

        # 5. LanceDB on the same table: flat scan, then its own IVF_PQ index at a few settings
        if not args.no_lancedb:
            db = lancedb.connect(path)
            table = db.open_table("memories")
            extra_rows = table.count_rows() - n
            if extra_rows:
                table.delete(f"id >= {n}")
                table.optimize()
            nq_flat = min(args.queries, 20 if n > 200_000 else 100)

            def lance_flat(q):
                return table.search(q, vector_column_name="vector").distance_type("dot").bypass_vector_index() \
                    .select(["id"]).limit(k).to_arrow().column("id").to_numpy()
            times, got = timed(lance_flat, queries[:nq_flat], warmup=2)
            record("LanceDB flat (scan)", times, got)
            partitions = max(1, int(np.sqrt(n) / 4)) if args.lance_partitions is None else args.lance_partitions
            t0 = time.perf_counter()
            table.create_index("vector", config=IvfPq(distance_type="dot", num_partitions=partitions,
                                                      num_sub_vectors=args.dim // 8))
            lance_build = time.perf_counter() - t0
            index_mb = round(du_mb(os.path.join(path, "memories.lance", "_indices")), 1)
            for nprobes, refine in args.lance_settings:
                def lance_ann(q, nprobes=nprobes, refine=refine):
                    b = table.search(q, vector_column_name="vector").distance_type("dot").nprobes(nprobes)
                    if refine:
                        b = b.refine_factor(refine)
                    return b.select(["id"]).limit(k).to_arrow().column("id").to_numpy()
                times, got = timed(lance_ann, queries[: min(args.queries, 200)], warmup=3)
                record(f"LanceDB IVF_PQ nprobes {nprobes} refine {refine}", times, got,
                       build_s=round(lance_build, 1), partitions=partitions, index_mb=index_mb)
            del table, db
        gc.collect()
    for r in results:
        r.setdefault("default_p50_ms", default_p50)
    return results


# ---- LoCoMo: real text ---------------------------------------------------------------------------
def run_locomo(args, log) -> list[dict]:
    if not LOCOMO.exists():
        log(f"  locomo: {LOCOMO} not found, skipped")
        return []
    import faiss
    from tiered_recall.embedders import WordLlamaEmbedder
    from tiered_recall.storage import ColdStore

    samples = json.loads(LOCOMO.read_text(encoding="utf-8"))
    texts, namespaces, dia = [], [], []
    for sample in samples:
        conv = sample["conversation"]
        for name, turns in conv.items():
            if not (re.fullmatch(r"session_\d+", name) and isinstance(turns, list)):
                continue
            date = conv.get(f"{name}_date_time", "")
            for turn in turns:
                texts.append(f"[{date}] {turn['speaker']} said, \"{turn['text']}\"")
                namespaces.append(sample["sample_id"])
                dia.append(turn["dia_id"])
    questions, _ = load_questions(LOCOMO)
    embed = WordLlamaEmbedder(dim=256)
    vectors = np.ascontiguousarray(embed(texts), dtype=np.float32)
    qvecs = np.ascontiguousarray(embed([q.text for q in questions]), dtype=np.float32)
    n, dim = vectors.shape
    out = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        # faiss_min_rows below the row count: the ANN path is exercised on real text (the default would be exact).
        with ColdStore(os.path.join(tmp, "cold"), dim=dim, faiss_min_rows=1000) as store:
            ids = np.arange(n, dtype=np.int64)
            store.add(**rows_batch(ids, vectors, namespaces=namespaces, texts=texts))
            store.build_index()
            info = store.stats()["faiss"]
            mat = vectors
            truth = exact_truth(mat, qvecs, 10)
            for method, fn in [
                ("cold default (FAISS IVF + rerank)", lambda q: store.search(q, k=10)[0]),
            ]:
                times, got = timed(fn, qvecs)
                out.append({"dataset": "locomo", "rows": n, "dim": dim, "method": method, "queries": len(times),
                            "p50_ms": pct(times, 50), "p99_ms": pct(times, 99),
                            "recall@10": recall_at(got, truth, 10), "nlist": info["nlist"], "nprobe": info["nprobe"]})
            flat = faiss.IndexFlatIP(dim)
            flat.add(mat)
            faiss.omp_set_num_threads(1)
            times, got = timed(lambda q: flat.search(q.reshape(1, -1), 10)[1][0], qvecs)
            out.append({"dataset": "locomo", "rows": n, "dim": dim, "method": "FAISS exact (flat, 1 thread)",
                        "queries": len(times), "p50_ms": pct(times, 50), "p99_ms": pct(times, 99),
                        "recall@10": recall_at(got, truth, 10)})
            # Evidence recall per conversation (the LoCoMo metric), vector vs BM25 vs hybrid.
            dia_of = dict(zip(ids.tolist(), dia))
            for mode in ("vector", "bm25", "hybrid"):
                scores, times = [], []
                for q, qv in zip(questions, qvecs):
                    t0 = time.perf_counter()
                    if mode == "vector":
                        got_ids = store.search(qv, k=10, namespace=q.conversation)[0]
                    elif mode == "bm25":
                        got_ids = store.text_search(q.text, k=10, namespace=q.conversation)[0]
                    else:
                        got_ids = store.search(qv, k=10, namespace=q.conversation, text=q.text)[0]
                    times.append(time.perf_counter() - t0)
                    found = {dia_of[i] for i in got_ids.tolist()}
                    scores.append(len(found & set(q.evidence)) / len(q.evidence))
                out.append({"dataset": "locomo", "rows": n, "dim": dim, "method": f"evidence R@10 {mode}",
                            "queries": len(times), "p50_ms": pct(times, 50), "p99_ms": pct(times, 99),
                            "R@10": round(100 * float(np.mean(scores)), 1)})
    for r in out:
        log(f"  locomo {r['rows']}x{r['dim']:<5d} {r['method']:34s} p50 {r['p50_ms']:8.3f} ms p99 {r['p99_ms']:8.3f} ms "
            + (f"recall@10 {r['recall@10']:.4f}" if "recall@10" in r else f"R@10 {r['R@10']}"))
    return out


def draw(results: list[dict], png: str, log) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no PNG written")
        return
    rows = [r for r in results if "p50_ms" in r and r.get("recall@10") is not None]
    adds = [r for r in results if "add_times_ms" in r]
    fig, axes = plt.subplots(1, 2 if adds else 1, figsize=(16 if adds else 9, 6), squeeze=False)
    ax = axes[0][0]
    for r in rows:
        ax.scatter(r["p50_ms"], r["recall@10"], s=30)
        ax.annotate(f"{r['dataset']} {r['rows']//1000}k\n{r['method']}", (r["p50_ms"], r["recall@10"]), fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("batch-1 p50 latency (ms, log)")
    ax.set_ylabel("recall@10 vs exact")
    ax.axhline(0.95, ls="--", lw=0.8)
    ax.axvline(2.0, ls="--", lw=0.8)
    ax.set_title("cold tier on a 2-core machine: latency vs recall")
    if adds:
        ax = axes[0][1]
        for r in adds:
            t = np.asarray(r["add_times_ms"])
            ax.plot(np.arange(t.shape[0]), t, ".", ms=1.5, alpha=0.5,
                    label=f"{r['dataset']} {r['rows']//1000}k {r['method']}: p50 {r['add_p50_ms']:.2f} ms, "
                          f"p99 {r['add_p99_ms']:.1f} ms")
        ax.set_yscale("log")
        ax.axhline(5.0, ls="--", lw=0.8)
        ax.set_xlabel("add number")
        ax.set_ylabel("single-row add latency, durable on return (ms, log)")
        ax.set_title("single-row adds: write-ahead log vs a LanceDB commit each")
        ax.legend(fontsize=7, markerscale=6)
    fig.tight_layout()
    fig.savefig(png, dpi=130)
    log(f"wrote {png}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--datasets", nargs="+", default=["clustered", "random", "locomo"],
                    choices=["clustered", "random", "locomo"])
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--centres", type=int, default=4096)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--adds", type=int, default=10_000, help="single-row adds timed after the bulk load (0: skip)")
    ap.add_argument("--baseline-adds", type=int, default=300,
                    help="single-row adds with wal=False (a LanceDB commit each) after them, the peer (0: skip)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--faiss-min-rows", type=int, default=20_000)
    ap.add_argument("--lance-partitions", type=int, default=None)
    ap.add_argument("--lance-settings", type=lambda s: tuple(int(x) for x in s.split("/")), nargs="+",
                    default=[(20, 10), (50, 20)], help="nprobes/refine_factor pairs for LanceDB's IVF_PQ")
    ap.add_argument("--no-lancedb", action="store_true")
    ap.add_argument("--quick", action="store_true", help="20k and 50k rows, 200 queries, 1000 adds")
    ap.add_argument("--tmp", default=None, help="folder for the temporary stores")
    ap.add_argument("--json", dest="json_path", default=None)
    ap.add_argument("--png", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.queries, args.adds, args.baseline_adds = [20_000, 50_000], 200, 1000, 100
    os.environ.setdefault("LANCE_CPU_THREADS", str(os.cpu_count() or 1))

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(f"cold_latency: rows {args.rows}, datasets {args.datasets}, dim {args.dim}, {os.cpu_count()} cores")
    results: list[dict] = []
    for dataset in args.datasets:
        if dataset == "locomo":
            results += run_locomo(args, log)
            continue
        for n in args.rows:
            results += run_case(dataset, n, args, log)
            if args.json_path:  # partial results survive a long run being cut short
                Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json_path).write_text(json.dumps(results, indent=1, default=str))

    log("\n| dataset | rows | method | p50 ms | p99 ms | recall@10 | build s | notes |")
    log("|---|---|---|---|---|---|---|---|")
    for r in results:
        if "add_p50_ms" in r:
            note = (f"search after adds p50 {r['search_after_adds_p50_ms']:.3f} ms vs compacted "
                    f"{r['search_compacted_p50_ms']:.3f} ms (ratio {r['ratio_after_vs_compacted']:.2f}; steady p50 "
                    f"{r['search_after_adds_steady_p50_ms']:.3f} vs {r['search_compacted_steady_p50_ms']:.3f}, ratio "
                    f"{r['ratio_after_vs_compacted_steady']:.2f}); {r['adds_per_s']} adds/s, {r['wal_flushes']} flushes"
                    if "search_after_adds_p50_ms" in r else f"{r['ratio_commit_vs_wal_p50']:.1f}x the WAL's add p50")
            log(f"| {r['dataset']} | {r['rows']} | {r['method']} | add {r['add_p50_ms']:.3f} | add {r['add_p99_ms']:.3f} "
                f"| | | {note} |")
            continue
        rec = r.get("recall@10")
        log(f"| {r['dataset']} | {r['rows']} | {r['method']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
            f"{'' if rec is None else f'{rec:.4f}'} | {r.get('build_s', '')} | "
            + ", ".join(f"{key} {r[key]}" for key in ("choice", "tuned_recall", "nlist", "nprobe", "R@10", "index_mb", "faiss_mb", "mirror_mb",
                                                       "rss_mb", "partitions") if key in r) + " |")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(results, indent=1, default=str))
        log(f"wrote {args.json_path}")
    if args.png:
        draw(results, args.png, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
