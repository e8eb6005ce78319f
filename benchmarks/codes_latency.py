"""Batch-1 search latency with the int8 codes (--codes int8) against the full scan of the rows, the peer library and
the bandwidth floor, in one run; every answer's ids compared.

CPU (default; 2 cores, dim 384, one namespace of 100k rows): TieredMemory.search on a store whose CPU sidecar scans
the codes, the same on a store whose sidecar runs --codes off, numpy's float32 scan (X @ q + argpartition), and the
raw sidecars (HotTier.search) beside them, alternated over rounds: medians of the rounds' p50 and their spread.

CUDA (dim 768, 100k and 1M rows): two sidecars (codes int8, codes off: the f16 scan), PyTorch (f16 matmul + topk),
and the floors (the f16 rows', and the codes', bytes over the device-to-device copy bandwidth measured in the same
run), alternated over rounds; then queries per second of 1 and 16 client processes at 100k.

    python benchmarks/codes_latency.py                              # CPU
    python benchmarks/codes_latency.py --backend cuda --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from tiered_recall.hot import HotTier, start_sidecar
from tiered_recall.testing.gpu_bench import copy_bandwidth, measure_qps
from tiered_recall.testing.timing import time_calls


def unit_rows(rng: np.random.Generator, n: int, dim: int, uniform: bool = False) -> np.ndarray:
    x = (rng.random((n, dim), dtype=np.float32) - 0.5) if uniform else rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def p50_us(samples_ns: list[int]) -> float:
    return float(np.percentile(np.asarray(samples_ns, dtype=np.float64), 50)) / 1e3


def p99_us(samples_ns: list[int]) -> float:
    return float(np.percentile(np.asarray(samples_ns, dtype=np.float64), 99)) / 1e3


def summary(rounds: list[float]) -> dict:
    return {"median": float(np.median(rounds)), "min": float(np.min(rounds)), "max": float(np.max(rounds)),
            "rounds": [float(r) for r in rounds]}


def numpy_topk(x: np.ndarray, k: int):
    def search(q: np.ndarray):
        s = x @ q
        top = np.argpartition(-s, k)[:k]
        return top[np.argsort(-s[top], kind="stable")]
    return search


# ---- CPU -----------------------------------------------------------------------------------------------------------

def run_cpu(args) -> dict:
    from tiered_recall import TieredMemory

    rng = np.random.default_rng(args.seed)
    rows, dim, k = args.rows[0], args.dim or 384, args.k
    x = unit_rows(rng, rows, dim)
    queries = unit_rows(rng, args.queries, dim)
    out = {"backend": "cpu", "machine": os.uname().nodename, "cores": os.cpu_count(), "rows": rows, "dim": dim, "k": k,
           "queries": args.queries, "rounds": args.rounds}
    stores, procs, hots = {}, [], {}
    with tempfile.TemporaryDirectory(prefix="tr-codes-") as tmp:
        try:
            for codes in ("int8", "off"):
                path = Path(tmp) / f"store-{codes}"
                with TieredMemory(path, dim=dim, embedder=None, device="none") as probe:
                    name = probe.sidecar_name
                # the store's sidecar, started here with the codes asked for; the store attaches to it
                procs.append(start_sidecar(name, dim=dim, capacity=rows + 1024, codes=codes))
                memory = TieredMemory(path, dim=dim, embedder=None, device="cpu", hot_capacity=rows + 1024,
                                      timeout_s=60.0)
                t0 = time.perf_counter()
                for lo in range(0, rows, 5000):
                    memory.add(vectors=x[lo:lo + 5000], texts=["t"] * min(5000, rows - lo), namespace="n",
                               ids=np.arange(lo + 1, min(rows, lo + 5000) + 1))
                out[f"load_s_{codes}"] = time.perf_counter() - t0
                stores[codes] = memory
                hots[codes] = HotTier.attach(name, timeout_s=60)
                assert hots[codes].codes == codes and hots[codes].hot_rows == rows
            ref = numpy_topk(x, k)
            contenders = {
                "memory_int8": lambda q: stores["int8"].search(q, k=k, namespace="n"),
                "memory_off": lambda q: stores["off"].search(q, k=k, namespace="n"),
                "numpy": ref,
                "sidecar_int8": lambda q: hots["int8"].search(q, k=k),
                "sidecar_off": lambda q: hots["off"].search(q, k=k),
            }
            p50 = {label: [] for label in contenders}
            for r in range(args.rounds):
                for label, fn in contenders.items():
                    p50[label].append(p50_us(time_calls(fn, queries, args.warmup)))
                print(f"round {r + 1}: " + ", ".join(f"{lbl} {v[-1]:.0f} us" for lbl, v in p50.items()), flush=True)
            out["p50_us"] = {label: summary(v) for label, v in p50.items()}
            out["ratio_to_numpy"] = {label: float(np.median(np.asarray(v) / np.asarray(p50["numpy"])))
                                     for label, v in p50.items()}
            same = 0
            for q in queries:
                want = (ref(q) + 1).tolist()
                got = [int(h.id) for h in stores["int8"].search(q, k=k, namespace="n")]
                same += got == want
            out["identical_ids"] = {"queries": len(queries), "same_as_numpy": same}
            out["stats_int8"] = {key: v for key, v in hots["int8"].stats().items() if key.startswith("code")}
            out["rules"] = {}
            for q in queries[:20]:
                rule = stores["int8"].search(q, k=k, namespace="n", explain=True).rule
                out["rules"][rule] = out["rules"].get(rule, 0) + 1
        finally:
            for h in hots.values():
                h.close()
            for m in stores.values():
                m.close()
            for p in procs:
                p.stop()
    return out


def print_cpu(out: dict) -> None:
    print(f"\nCPU, {out['cores']} cores, {out['rows']:,} x {out['dim']}, k={out['k']}, batch 1; medians of "
          f"{out['rounds']} alternated rounds of {out['queries']} queries (p50 of each round), min-max in brackets; "
          "the machine may be shared")
    for label, s in out["p50_us"].items():
        print(f"  {label:>13}: p50 {s['median']:9.1f} us [{s['min']:.0f}-{s['max']:.0f}]   x numpy "
              f"{out['ratio_to_numpy'][label]:.2f}")
    ids = out["identical_ids"]
    print(f"  TieredMemory with codes: ids identical to numpy's on {ids['same_as_numpy']} of {ids['queries']} "
          f"queries; {out['stats_int8']}; rules {out['rules']}")


# ---- CUDA ----------------------------------------------------------------------------------------------------------

def run_cuda(args) -> dict:
    import torch

    bw = copy_bandwidth(torch)
    dim, k = args.dim or 768, args.k
    out = {"backend": "cuda", "gpu": torch.cuda.get_device_name(0), "copy_bandwidth_Bps": bw, "dim": dim, "k": k,
           "queries": args.queries, "rounds": args.rounds, "sizes": [], "qps": []}
    print(f"{out['gpu']}: device-to-device copy {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    rng = np.random.default_rng(args.seed)
    cap = max(args.rows)
    names = {codes: f"bench-{codes}-{uuid.uuid4().hex[:6]}" for codes in ("int8", "off")}
    procs = [start_sidecar(names[c], dim=dim, capacity=cap, dtype="f16", backend="cuda", codes=c) for c in names]
    try:
        hots = {c: HotTier.attach(n, timeout_s=60) for c, n in names.items()}
        xdev = torch.empty((cap, dim), dtype=torch.float16, device="cuda")
        queries = unit_rows(rng, args.queries, dim, uniform=True)
        loaded = 0
        for rows in sorted(args.rows):
            t0 = time.perf_counter()
            while loaded < rows:
                m = min(65536, rows - loaded)
                x = unit_rows(rng, m, dim, uniform=True)
                for h in hots.values():
                    h.upsert(np.arange(loaded, loaded + m, dtype=np.int64), x, 1)
                xdev[loaded:loaded + m] = torch.from_numpy(x).to("cuda").half()
                loaded += m
            load_s = time.perf_counter() - t0
            xn = xdev[:rows]

            def torch_fn(q, xn=xn):
                qt = torch.from_numpy(q).to("cuda").half()
                v, i = torch.topk(xn @ qt, k)
                return i.cpu().numpy()

            contenders = {"int8": lambda q: hots["int8"].search(q, k=k), "f16": lambda q: hots["off"].search(q, k=k),
                          "torch": torch_fn}
            p50, p99 = {c: [] for c in contenders}, {c: [] for c in contenders}
            served = {"int8": [], "f16": []}  # the sidecar's own time a search (submit to published), mean
            for _ in range(args.rounds):
                for label, fn in contenders.items():
                    hot = {"int8": hots["int8"], "f16": hots["off"]}.get(label)
                    before = hot.stats() if hot else None
                    t = time_calls(fn, queries, args.warmup)
                    p50[label].append(p50_us(t))
                    p99[label].append(p99_us(t))
                    if hot:
                        after = hot.stats()
                        total = (after["search_mean_us"] or 0) * after["searches"] - \
                            (before["search_mean_us"] or 0) * before["searches"]
                        served[label].append(total / max(1, after["searches"] - before["searches"]))
            same_ids = same_scores = 0
            for q in queries:
                a, b = hots["int8"].search(q, k=k), hots["off"].search(q, k=k)
                same_ids += bool(np.array_equal(a.ids, b.ids))
                same_scores += bool(np.array_equal(a.scores, b.scores))
            floor_f16 = rows * dim * 2 / bw * 1e6
            floor_int8 = rows * ((dim + 63) // 64 * 64) / bw * 1e6
            e = {"rows": rows, "load_s": load_s, "floor_f16_us": floor_f16, "floor_int8_us": floor_int8,
                 "p50_us": {c: summary(v) for c, v in p50.items()}, "p99_us": {c: summary(v) for c, v in p99.items()},
                 "identical_ids": same_ids, "identical_scores": same_scores, "compared": len(queries),
                 "server_mean_us": {c: summary(v) for c, v in served.items()},
                 "stats_int8": {key: v for key, v in hots["int8"].stats().items() if key.startswith("code")}}
            i8, f16 = e["p50_us"]["int8"]["median"], e["p50_us"]["f16"]["median"]
            e.update({"int8_over_f16_floor": i8 / floor_f16, "f16_over_int8": f16 / i8,
                      "int8_over_torch": i8 / e["p50_us"]["torch"]["median"]})
            out["sizes"].append(e)
            print(f"{rows:>8} x {dim}: int8 p50 {i8:.1f} us, f16 {f16:.1f}, torch {e['p50_us']['torch']['median']:.1f},"
                  f" floor f16 {floor_f16:.1f} (int8 bytes {floor_int8:.1f}) | int8/floor {i8 / floor_f16:.2f}, "
                  f"f16/int8 {f16 / i8:.2f} | ids identical {same_ids}/{len(queries)}, scores {same_scores} | "
                  f"server-side mean int8 {e['server_mean_us']['int8']['median']:.1f} us, f16 "
                  f"{e['server_mean_us']['f16']['median']:.1f} | {e['stats_int8']} | load {load_s:.0f}s", flush=True)
            if rows == args.qps_rows:
                for c in args.clients:
                    for codes, name in names.items():
                        qps = measure_qps(name, dim, k, c, args.qps_seconds)["qps"]
                        r = {"rows": rows, "clients": c, "codes": codes, "qps": qps}
                        out["qps"].append(r)
                        print(f"  {c:>2} clients, codes {codes}: {r['qps']:9.0f} QPS", flush=True)
        for h in hots.values():
            h.close()
    finally:
        for p in procs:
            p.stop()
    return out


def print_cuda(out: dict) -> None:
    print(f"\n{out['gpu']}, {out['dim']} d, f16 rows, k={out['k']}, batch 1; copy bandwidth "
          f"{out['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; medians of {out['rounds']} alternated rounds")
    print(f"{'rows':>9} | {'int8 p50':>9} {'f16 p50':>8} {'torch':>8} {'floor':>7} | {'int8/floor':>10} "
          f"{'f16/int8':>8} | ids same | scores same")
    for s in out["sizes"]:
        p = s["p50_us"]
        print(f"{s['rows']:>9} | {p['int8']['median']:>7.1f}us {p['f16']['median']:>6.1f}us "
              f"{p['torch']['median']:>6.1f}us {s['floor_f16_us']:>5.1f}us | {s['int8_over_f16_floor']:>10.2f} "
              f"{s['f16_over_int8']:>8.2f} | {s['identical_ids']:>4}/{s['compared']} | {s['identical_scores']}")
    for r in out["qps"]:
        print(f"QPS {r['rows']:,} rows, {r['clients']:>2} clients, codes {r['codes']}: {r['qps']:.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rows", type=int, nargs="+", help="cpu: 100000; cuda: 100000 1000000")
    parser.add_argument("--dim", type=int, help="cpu: 384; cuda: 768")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="*", default=[1, 16], help="cuda: QPS with this many processes")
    parser.add_argument("--qps-rows", type=int, default=100_000)
    parser.add_argument("--qps-seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.backend == "cpu":
        args.rows = args.rows or [100_000]
        out = run_cpu(args)
        print_cpu(out)
    else:
        args.rows = args.rows or [100_000, 1_000_000]
        out = run_cuda(args)
        print_cuda(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
