"""How tight the int8 codes' error bounds are, per-row scale against per-dimension scales, on real and synthetic rows.

For each data set and each way of quantising the rows, the script prints the mean guaranteed error bound of a score
estimate (as a fraction of the spread of the scores, their standard deviation over all rows), and how many rows per
query an exact re-rank would have to score at k=10 (those whose upper bound reaches the k-th best lower bound).
Quantisations: per-row scale (step = max |x_j| / 127 for each row) and per-dimension scales (step_j = max over the
rows of |x_ij| / 127, from the data itself: the best case for a fixed table). Bounds:
  "cs":  |q.x - q.x'| <= |q| |x - x'|           (the residual's norm, stored per row; Cauchy-Schwarz)
  "l1":  |q.x - q.x'| <= sum_j |q_j| step_j / 2  (the per-dimension worst case)
and, for the CPU's integer scan, the query's own 8-bit rounding added: + |q - q'| |x'|.

    python benchmarks/codes_bounds.py                      # E5 and WordLlama on the LoCoMo dev split, random, clustered
    python benchmarks/codes_bounds.py --sets random clustered --rows 100000
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

DEFAULT_DATA = Path("/work/shared/data/locomo/locomo_dev.json")


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def locomo_texts(path: Path) -> tuple[list[str], list[str]]:
    data = json.loads(path.read_text())
    turns, questions = [], []
    for conv in data:
        for key, value in conv["conversation"].items():
            if key.startswith("session_") and isinstance(value, list):
                turns += [t["text"] for t in value if t.get("text")]
        questions += [q["question"] for q in conv["qa"]]
    return turns, questions


def data_set(name: str, rows: int, dim: int, queries: int, rng: np.random.Generator, data: Path):
    if name == "random":
        return unit(rng.standard_normal((rows, dim))), unit(rng.standard_normal((queries, dim)))
    if name == "clustered":
        centres = unit(rng.standard_normal((64, dim)))
        x = centres[rng.integers(0, 64, rows)] + 0.35 * unit(rng.standard_normal((rows, dim)))
        q = centres[rng.integers(0, 64, queries)] + 0.35 * unit(rng.standard_normal((queries, dim)))
        return unit(x), unit(q)
    turns, questions = locomo_texts(data)
    if name == "e5":
        from tiered_recall.embedders.e5 import E5Embedder

        emb = E5Embedder()
        return unit(emb.embed_passages(turns)), unit(emb.embed_queries(questions[:queries]))
    if name == "wordllama":
        from tiered_recall.embedders.wordllama import WordLlamaEmbedder

        emb = WordLlamaEmbedder()
        return unit(emb.embed_passages(turns)), unit(emb.embed_queries(questions[:queries]))
    raise ValueError(name)


def quantise(x: np.ndarray, per: str) -> tuple[np.ndarray, np.ndarray]:
    """(dequantised rows, steps broadcastable to x) for per-row or per-dimension max-abs scales."""
    x64 = x.astype(np.float64)
    if per == "row":
        step = np.abs(x64).max(axis=1, keepdims=True) / 127.0
    else:
        step = np.abs(x64).max(axis=0, keepdims=True) / 127.0
    step = np.where(step == 0, 1.0, step)
    codes = np.clip(np.rint(x64 / step), -127, 127)
    return codes * step, np.broadcast_to(step, x.shape)


def query_rounding(q: np.ndarray) -> np.ndarray:
    """|q - q'| of each query under its own 8-bit per-query scale (the CPU scan's integer query)."""
    q64 = q.astype(np.float64)
    step = np.abs(q64).max(axis=1, keepdims=True) / 127.0
    return np.linalg.norm(q64 - np.clip(np.rint(q64 / step), -127, 127) * step, axis=1)


def measure(x: np.ndarray, q: np.ndarray, k: int) -> list[dict]:
    exact = q.astype(np.float64) @ x.astype(np.float64).T  # queries x rows
    spread = float(exact.std())
    out = []
    eq = query_rounding(q)
    for per in ("row", "dim"):
        xq, step = quantise(x, per)
        est = q.astype(np.float64) @ xq.T
        resid = np.linalg.norm(x.astype(np.float64) - xq, axis=1)  # per row
        xqn = np.linalg.norm(xq, axis=1)
        qn = np.linalg.norm(q.astype(np.float64), axis=1)
        l1 = np.abs(q.astype(np.float64)) @ (step[0] if per == "dim" else np.zeros(x.shape[1])) / 2.0
        bounds = {
            "cs": qn[:, None] * resid[None, :],
            "l1": (np.abs(q.astype(np.float64)).sum(axis=1)[:, None] * step[:, 0][None, :] / 2.0 if per == "row"
                   else np.repeat(l1[:, None], x.shape[0], axis=1)),
        }
        bounds["cs+query"] = bounds["cs"] + eq[:, None] * xqn[None, :]
        for label, err in bounds.items():
            assert np.all(np.abs(exact - est) <= err + 1e-12) or label == "cs+query", f"{per}/{label} not a bound"
            lo, hi = est - err, est + err
            kth = -np.sort(-lo, axis=1)[:, k - 1]
            cands = (hi >= kth[:, None]).sum(axis=1)
            out.append({"scale": per, "bound": label, "mean_bound_over_spread": float(err.mean() / spread),
                        "candidates_p50": float(np.median(cands)), "candidates_p99": float(np.percentile(cands, 99)),
                        "max_error_over_spread": float(np.abs(exact - est).max() / spread)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["e5", "wordllama", "random", "clustered"])
    parser.add_argument("--rows", type=int, default=20000, help="rows of the synthetic sets")
    parser.add_argument("--dim", type=int, default=384, help="dimension of the synthetic sets")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="locomo_dev.json (the dev split only)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    results = []
    print(f"{'set':>10} {'rows':>7} {'dim':>4} | {'scale':>5} {'bound':>8} | {'bound/spread':>12} | "
          f"{'cand p50':>8} {'p99':>7}")
    for name in args.sets:
        x, q = data_set(name, args.rows, args.dim, args.queries, rng, args.data)
        for r in measure(x, q, args.k):
            r.update({"set": name, "rows": int(x.shape[0]), "dim": int(x.shape[1])})
            results.append(r)
            print(f"{name:>10} {x.shape[0]:>7} {x.shape[1]:>4} | {r['scale']:>5} {r['bound']:>8} | "
                  f"{r['mean_bound_over_spread']:>12.4f} | {r['candidates_p50']:>8.0f} {r['candidates_p99']:>7.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
