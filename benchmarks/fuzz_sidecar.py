"""Hostile-client fuzzing, long version (issue 8, part 2): millions of random and boundary requests against an
ASan + UBSan sidecar while honest clients check their answers; then the header-geometry scribbler.

    python benchmarks/fuzz_sidecar.py --requests 10000000 --seconds 600 [--build /tmp/asan-fuzz]

Builds native/ with -DTR_SANITIZE=ON -DTR_BUILD_FUZZ=ON (unless --build already holds it), prints one JSON
line: requests sent and answered, anomalies, hangs, sanitizer reports (must be 0), honest answers wrong (must be 0).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
import uuid
from pathlib import Path

from tiered_recall.testing.fuzz import SanitizedSidecar, build_sanitized, honest_client, run_fuzzer, sanitizer_reports

NATIVE = Path(__file__).resolve().parents[1] / "native"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--honest", type=int, default=2)
    ap.add_argument("--build", type=Path, default=Path("/tmp/tr-asan-fuzz"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not (args.build / "tr-fuzz-client").exists():
        build_sanitized(NATIVE, args.build)
    log = Path(f"/tmp/tr-fuzz-sidecar-{uuid.uuid4().hex[:8]}.log")
    side = SanitizedSidecar(args.build, f"fzl-{uuid.uuid4().hex[:10]}", log, dim=16, capacity=4000, slots=16)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    stop = ctx.Event()  # the fuzz run may end on its request count long before --seconds
    honest = [ctx.Process(target=honest_client, args=(side.name, w, args.seconds + 5, queue, stop))
              for w in range(args.honest)]
    for p in honest:
        p.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    main_run = run_fuzzer(args.build, side.name, "--requests", str(args.requests), "--seconds", str(args.seconds),
                          "--inflight", str(args.inflight), "--seed", str(args.seed), timeout=args.seconds + 120)
    fuzz_s = time.monotonic() - t0
    stop.set()
    results = []
    for _ in honest:
        try:
            results.append(queue.get(timeout=60))
        except Exception:
            results.append((None, 0, 0, ["no report"], "timeout"))
    for p in honest:
        p.join(10)
    header_run = run_fuzzer(args.build, side.name, "--requests", "50000", "--seconds", "5", "--header-garbage",
                            "--seed", str(args.seed + 1))
    alive = side.popen.poll() is None
    code = side.stop()
    reports = sanitizer_reports(side.log())
    print(json.dumps({
        "requests_sent": main_run["sent"] + header_run["sent"], "requests_answered": main_run["answered"] + header_run["answered"],
        "fuzz_seconds": round(fuzz_s, 1), "rate_per_s": main_run["rate"], "anomalies": main_run["anomalies"] + header_run["anomalies"],
        "hangs": main_run["hangs"] + header_run["hangs"], "races": main_run["races"], "header_rounds": header_run["header_rounds"],
        "status_histogram": main_run["by_status"], "sidecar_alive_at_end": alive, "sidecar_exit_code": code,
        "sanitizer_reports": len(reports), "sanitizer_lines": reports[:10],
        "honest": [{"worker": w, "searches": s, "found_own_row": f, "wrong": len(wr), "error": e} for w, s, f, wr, e in results],
        "sidecar_log": str(log),
    }))


if __name__ == "__main__":
    main()
