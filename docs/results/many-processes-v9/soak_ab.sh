#!/usr/bin/env bash
# Alternated soak A/B on the 2-core machine: before (TR_HACK=before) and after, ROUNDS times each, OPS operations.
# Usage: OPS=300000 ROUNDS=2 OUTDIR=/tmp/soak-ab bash docs/results/many-processes-v9/soak_ab.sh   (run from /tmp)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
ops="${OPS:-300000}"; rounds="${ROUNDS:-2}"; out="${OUTDIR:-/tmp/soak-ab}"
python="${PYTHON:-$repo/.venv/bin/python}"
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    hack=""; [ "$side" = before ] && hack=before
    TR_HACK="$hack" PYTHONPATH="$here" "$python" "$repo/benchmarks/soak.py" --processes 8 --ops "$ops" --warmup 300 \
      --settle-s 5 --bounded-allocators --stages off 2>"$out/$side-$r.err" | grep '^{' >"$out/$side-$r.json"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], d['ops_per_s'], \
json.dumps(d['write_lock']['held_share_of_wall']), json.dumps(d['op_mean_ms']), json.dumps(d['workers_rows_moved']))" \
      "$out/$side-$r.json" "$side" "$r"
  done
done
