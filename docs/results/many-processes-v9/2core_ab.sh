#!/bin/bash
# The A/B of the ninth session's promotion skip on the 2-core machine: main before it (4239d83; TR_HACK=before, this
# folder's sitecustomize.py) against the installed code, alternated, ROUNDS rounds (default 5), rows as JSON lines.
cd /tmp
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
for r in $(seq "${ROUNDS:-5}"); do
  for v in before new; do
    echo "== $v round $r"
    TR_HACK=$v PYTHONPATH="$HERE" "$ROOT/.venv/bin/python" "$ROOT/benchmarks/many_processes.py" \
      --processes 2 8 --mix 95/5 --seconds 8 2>&1 | grep '^{'
  done
done
echo done
