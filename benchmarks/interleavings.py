"""The randomized cross-process exactness check, long: N processes over one store, every search compared with exact
search over a model of the rows (tiered_recall.testing.interleavings); prints the operation counts, the rules that
decided the searches, and the rate, and one JSON line. A wrong answer stops it with the seed and the operation log.

    python benchmarks/interleavings.py --ops 100000 --seed 7
    python benchmarks/interleavings.py --ops 20000 --devices none cpu cuda     # on the GPU machine
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from tiered_recall.testing.interleavings import Failure, Mix, run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000, help="operations in all (default 100,000)")
    parser.add_argument("--seed", type=int, default=1, help="the seed that draws everything (default 1)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--devices", nargs="+", default=["none", "cpu"], choices=["none", "cpu", "cuda"],
                        help="devices the workers draw from (default: none cpu)")
    parser.add_argument("--hot-capacity", type=int, default=40, help="hot-tier rows (default 40)")
    parser.add_argument("--mix", nargs=6, type=float, metavar=("ADD", "UPSERT", "DELETE", "SEARCH", "REOPEN", "KILL"),
                        default=None, help="relative weights of the operations (default: 30 10 10 45 2 0.5)")
    parser.add_argument("--store", type=Path, default=None, help="store folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tr-interleavings-") as tmp:
        store = args.store or Path(tmp) / "store"
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), transient=True) as bar:
            task = bar.add_task(f"seed {args.seed}", total=args.ops)
            try:
                result = run(store, seed=args.seed, ops=args.ops, workers=args.workers, devices=tuple(args.devices),
                             hot_capacity=args.hot_capacity, mix=None if args.mix is None else Mix(*args.mix),
                             progress=lambda done: bar.update(task, completed=done))
            except Failure as failure:
                print(failure, file=sys.stderr)
                return 1
    searches = result.counts["search"]
    print(f"seed {result.seed}: {result.ops:,} operations by {args.workers} processes ({', '.join(result.devices)}) "
          f"in {result.seconds:.0f} s ({result.ops / result.seconds:.0f}/s), 0 wrong answers")
    print("operations: " + ", ".join(f"{k} {v:,}" for k, v in result.counts.items()))
    print(f"rules of the {searches:,} searches: " + ", ".join(f"{k} {v:,}" for k, v in sorted(result.rules.items())))
    line = json.dumps(asdict(result))
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
