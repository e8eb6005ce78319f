"""The CUDA half of hot_latency.py: the cuda sidecar against PyTorch and CuPy in-process, one run.

Same vectors (float16 on the GPU) and the same query stream for every contender; batch 1, k=10.
Per size: p50 / p99 wall-clock per query (numpy query in, numpy ids and scores out), the ratio
to PyTorch and to the bandwidth floor (bytes of the vectors / device-to-device copy bandwidth,
measured in the same run). Then aggregate QPS of 1, 4, 16 client processes at 100k x 768.

    python benchmarks/hot_latency.py --backend cuda --json out.json --png out.png
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

import numpy as np

from tiered_recall.hot import HotTier, start_sidecar
from tiered_recall.testing.gpu_bench import copy_bandwidth, measure_qps, unit_chunk
from tiered_recall.testing.timing import time_calls

TARGET_US = {(4096, 768): 17.0, (100_000, 768): 60.0, (1_000_000, 768): 460.0}


def stats(samples_ns: list[int]) -> dict:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "mean_us": float(a.mean()), "n": int(a.size)}


def run(args) -> dict:
    import cupy as cp
    import torch

    bw = copy_bandwidth(torch)
    results = {"gpu": torch.cuda.get_device_name(0), "copy_bandwidth_Bps": bw, "k": args.k, "dtype": "f16",
               "cuda_persist": args.cuda_persist,
               "queries": args.queries, "warmup": args.warmup, "sizes": [], "qps": []}
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    rows_sorted = sorted(args.rows)
    cap = rows_sorted[-1]
    for dim in args.dims:
        rng = np.random.default_rng([args.seed, dim])
        name = f"bench-{uuid.uuid4().hex[:8]}"
        proc = start_sidecar(name, dim=dim, capacity=cap, dtype="f16", backend="cuda",
                             cuda_persist=args.cuda_persist == "on")
        try:
            hot = HotTier.attach(name, timeout_s=60)
            results["search_path"] = hot.search_path
            xdev = torch.empty((cap, dim), dtype=torch.float16, device="cuda")
            queries = unit_chunk(rng, args.queries, dim)
            # the protocol's own cost: ping, and a search on the empty tier (no kernel launch)
            results.setdefault("round_trip", []).append({
                "dim": dim, "ping": stats(time_calls(lambda q: hot.ping(), queries, args.warmup)),
                "empty_search": stats(time_calls(lambda q: hot.search(q, k=args.k), queries, args.warmup))})
            rt = results["round_trip"][-1]
            print(f"dim {dim}: ping p50 {rt['ping']['p50_us']:.1f} us, empty-tier search p50 "
                  f"{rt['empty_search']['p50_us']:.1f} us", flush=True)
            loaded = 0
            for rows in rows_sorted:
                t0 = time.perf_counter()
                while loaded < rows:
                    m = min(65536, rows - loaded)
                    x = unit_chunk(rng, m, dim)
                    hot.upsert(np.arange(loaded, loaded + m, dtype=np.int64), x, 1)
                    xdev[loaded:loaded + m] = torch.from_numpy(x).to("cuda").half()
                    loaded += m
                load_s = time.perf_counter() - t0
                xn = xdev[:rows]
                xc = cp.from_dlpack(xn)
                k = args.k

                def torch_fn(q, xn=xn, k=k):
                    qt = torch.from_numpy(q).to("cuda").half()
                    v, i = torch.topk(xn @ qt, k)
                    return i.cpu().numpy(), v.float().cpu().numpy()

                def cupy_fn(q, xc=xc, k=k):
                    qc = cp.asarray(q).astype(cp.float16)
                    s = xc @ qc
                    idx = cp.argpartition(-s, k)[:k]
                    sub = s[idx]
                    o = cp.argsort(-sub)
                    return cp.asnumpy(idx[o]), cp.asnumpy(sub[o].astype(cp.float32))

                def side_fn(q, k=k):
                    r = hot.search(q, k=k)
                    return r.ids[0], r.scores[0]

                entry = {"rows": rows, "dim": dim, "load_s": load_s}
                st0 = hot.stats()
                for label, fn in (("sidecar", side_fn), ("torch", torch_fn), ("cupy", cupy_fn)):
                    entry[label] = stats(time_calls(fn, queries, args.warmup))
                    if label == "sidecar":  # server-side time (backend submit -> published) of this loop only
                        st1 = hot.stats()
                        dn = st1["searches"] - st0["searches"]
                        tot = (st1["search_mean_us"] or 0) * st1["searches"] - (st0["search_mean_us"] or 0) * st0["searches"]
                        entry["sidecar_service_mean_us"] = tot / dn if dn else None
                agree = np.mean([len(set(side_fn(q)[0].tolist()) & set(torch_fn(q)[0].tolist())) / k
                                 for q in queries[:50]])
                floor_us = rows * dim * 2 / bw * 1e6
                s50 = entry["sidecar"]["p50_us"]
                entry.update({
                    "agreement_with_torch": float(agree),
                    "floor_us": floor_us,
                    "ratio_to_torch": s50 / entry["torch"]["p50_us"],
                    "ratio_to_cupy": s50 / entry["cupy"]["p50_us"],
                    "ratio_to_floor": s50 / floor_us,
                    "target_p50_us": TARGET_US.get((rows, dim), 1.25 * floor_us + 15.0),
                    "p99_over_p50": entry["sidecar"]["p99_us"] / s50,
                    "sidecar_service_p50_us": hot.stats().get("search_p50_us"),
                })
                results["sizes"].append(entry)
                print(f"dim {dim:>4} rows {rows:>8}: sidecar p50 {s50:8.1f} p99 {entry['sidecar']['p99_us']:8.1f} | "
                      f"torch {entry['torch']['p50_us']:8.1f} | cupy {entry['cupy']['p50_us']:8.1f} | "
                      f"floor {floor_us:7.1f} | agree {agree:.2f} | load {load_s:.1f}s | server-side mean "
                      f"{entry['sidecar_service_mean_us'] or 0:.1f} us", flush=True)
                if dim == args.qps_dim and rows == args.qps_rows:
                    for c in args.clients:
                        r = measure_qps(name, dim, k, c, args.qps_seconds)
                        r.update({"rows": rows, "dim": dim})
                        results["qps"].append(r)
                        print(f"  {c:>2} clients: {r['qps']:9.0f} QPS (client p50 {r['client_p50_us']:.1f} us, "
                              f"worst p99 {r['client_p99_us']:.1f} us)", flush=True)
                del xc
            hot.close()
            del xdev
            torch.cuda.empty_cache()
        finally:
            proc.stop()
    return results


def print_table(results: dict) -> None:
    print(f"\nhot-tier search, {results['gpu']}, f16, k={results['k']}, batch 1; "
          f"copy bandwidth {results['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; client search path: "
          f"{results.get('search_path', '?')}")
    print(f"{'dim':>4} {'rows':>8} | {'sidecar p50':>11} {'p99':>8} | {'torch p50':>9} {'cupy p50':>9} | "
          f"{'floor':>7} | {'x torch':>7} {'x floor':>7} | {'target':>7} | agree")
    for s in results["sizes"]:
        sd = s["sidecar"]
        print(f"{s['dim']:>4} {s['rows']:>8} | {sd['p50_us']:>9.1f}us {sd['p99_us']:>6.1f}us | "
              f"{s['torch']['p50_us']:>7.1f}us {s['cupy']['p50_us']:>7.1f}us | {s['floor_us']:>5.1f}us | "
              f"{s['ratio_to_torch']:>7.2f} {s['ratio_to_floor']:>7.2f} | {s['target_p50_us']:>5.1f}us | "
              f"{s['agreement_with_torch']:.2f}")
    for r in results["qps"]:
        print(f"QPS {r['rows']}x{r['dim']}, {r['clients']:>2} clients: {r['qps']:.0f}")


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len({s["dim"] for s in results["sizes"]}), figsize=(12, 4.5), squeeze=False)
    for ax, dim in zip(axes[0], sorted({s["dim"] for s in results["sizes"]})):
        rows = [s for s in results["sizes"] if s["dim"] == dim]
        x = [s["rows"] for s in rows]
        for label, style in (("sidecar", "o-"), ("torch", "s--"), ("cupy", "^--")):
            ax.plot(x, [s[label]["p50_us"] for s in rows], style, label=f"{label} p50")
        ax.plot(x, [s["sidecar"]["p99_us"] for s in rows], "o:", label="sidecar p99")
        ax.plot(x, [s["floor_us"] for s in rows], "k-", lw=0.8, label="bandwidth floor")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("rows")
        ax.set_ylabel("latency per query (us)")
        ax.set_title(f"dim {dim}, f16, k={results['k']}, batch 1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["cuda"], default="cuda")
    parser.add_argument("--rows", type=int, nargs="+", default=[4096, 100_000, 1_000_000, 4_000_000])
    parser.add_argument("--dims", type=int, nargs="+", default=[384, 768])
    parser.add_argument("--dim", type=int, help="one dim (same as --dims D)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--qps-rows", type=int, default=100_000)
    parser.add_argument("--qps-dim", type=int, default=768)
    parser.add_argument("--qps-seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cuda-persist", choices=["on", "off"], default="on",
                        help="the sidecar's persistent kernel (off: a launch per pass, for the ratio)")
    parser.add_argument("--json")
    parser.add_argument("--png")
    args = parser.parse_args(argv)
    if args.dim:
        args.dims = [args.dim]
    results = run(args)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.png:
        plot(results, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
