cd /tmp
for r in 1 2 3 4; do
  for v in allfollow new; do
    echo "== $v round $r"
    TR_HACK=$v PYTHONPATH=/work/main/docs/results/many-processes-v7 /work/main/.venv/bin/python /work/main/benchmarks/many_processes.py --processes 2 8 --mix 95/5 --seconds 8 2>&1 | grep '^{'
  done
done
echo done
