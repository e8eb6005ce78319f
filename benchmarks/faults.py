"""Fault injection (issue 8, part 1), long version: SIGKILL the sidecar under load, kill clients mid-request,
kill ingest runs, fill the disk. tests/coordinator/test_faults.py runs the same engines with small sizes in CI.

    python benchmarks/faults.py sidecar-kills --kills 25 --workers 4
    python benchmarks/faults.py client-kills --kills 30
    python benchmarks/faults.py ingest-kills --kills 12 --turns 3000
    python benchmarks/faults.py disk-full           (root: mounts a 4 MiB tmpfs)
    python benchmarks/faults.py all

Each prints one JSON line of figures: kills survived, acknowledged memories lost (must be 0),
calls that hung (must be 0), wrong answers (must be 0), restart times.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tiered_recall.testing.faults import client_kills, disk_full, ingest_kills, sidecar_kills

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", choices=["sidecar-kills", "client-kills", "ingest-kills", "disk-full", "all"])
    ap.add_argument("--kills", type=int, default=25)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=25, help="ingest-kills: turns per batch (one commit each)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tr-faults-") as tmp:
        tmp = Path(tmp)
        if args.which in ("sidecar-kills", "all"):
            print(json.dumps(sidecar_kills(tmp / "kills", kills=args.kills, workers=args.workers, seed=args.seed)), flush=True)
        if args.which in ("client-kills", "all"):
            print(json.dumps(client_kills(kills=args.kills, seed=args.seed)), flush=True)
        if args.which in ("ingest-kills", "all"):
            print(json.dumps(ingest_kills(tmp, kills=args.kills if args.which == "ingest-kills" else max(1, args.kills // 2),
                                          turns=args.turns, batch=args.batch, seed=args.seed)), flush=True)
        if args.which in ("disk-full", "all"):
            print(json.dumps(disk_full(tmp / "mnt")), flush=True)


if __name__ == "__main__":
    main()
