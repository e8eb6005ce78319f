#!/bin/bash
# The lock-hold probe, 8 processes at 95/5, the code before this session (TR_HACK=before) and after, two rounds
# alternated; then summarize.py prints each run's add and delete holds. Writes under /tmp/lockprobe.
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../../../.." && pwd)
mkdir -p /tmp/lockprobe/path
cp "$HERE/probe_sitecustomize.py" /tmp/lockprobe/path/sitecustomize.py
cp "$HERE/../sitecustomize.py" /tmp/lockprobe/path/v8patch.py
cd /tmp
for r in 1 2; do for v in before new; do
  rm -rf /tmp/lockprobe/$v-$r; mkdir -p /tmp/lockprobe/$v-$r
  TR_HACK=$v LOCKPROBE_DIR=/tmp/lockprobe/$v-$r PYTHONPATH=/tmp/lockprobe/path "$ROOT/.venv/bin/python" \
    "$ROOT/benchmarks/many_processes.py" --processes 8 --mix 95/5 --seconds 8 2>&1 | grep '^{' > /tmp/lockprobe/$v-$r/row.json
done; done
python3 "$HERE/summarize.py" /tmp/lockprobe/before-1 /tmp/lockprobe/before-2 /tmp/lockprobe/new-1 /tmp/lockprobe/new-2
