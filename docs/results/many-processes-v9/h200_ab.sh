# The A/B of the ninth session's changes (no promotions into a busy CPU sidecar, crowded writers that never queue)
# on the H200: 4239d83's behaviour (TR_HACK=before) against this code, alternated, with the CUDA sidecar and with the
# CPU sidecar, 8 and 16 processes at 95/5.
#   run(command="OUT=$OUT bash docs/results/many-processes-v9/h200_ab.sh", carry=["results/carry"])
set -uo pipefail
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
tar xJf results/carry/lancedb.tar.xz -C "$SP" && python3 -m pip install --no-deps --no-index -q results/carry/*.whl 2>&1 | grep -v WARNING | tail -3
[ -e tiered_recall/storage ] || ln -s ../storage tiered_recall/storage
cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/b.log 2>&1 && ninja -C /tmp/trcuda >> /tmp/b.log 2>&1 || { tail -20 /tmp/b.log; exit 1; }
export TIERED_RECALL_BIN_DIR=/tmp/trcuda PYTHONUNBUFFERED=1
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
for r in 1 2; do for dev in cuda cpu; do for v in before new; do
  echo "== $v $dev round $r"
  TR_HACK=$v PYTHONPATH=$PWD/docs/results/many-processes-v9:$PWD timeout 100 python3 benchmarks/many_processes.py --device $dev --processes 8 16 --mix 95/5 --seconds 6 2>&1 | grep '^{' | tee -a $OUT/ab_$v.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print({k:d.get(k) for k in ['processes','aggregate_ops_per_s','worker_cpu_ms_per_op','search_p99_ms','add_p50_ms','add_p99_ms','add_own_p99_ms','delete_p99_ms']})"
  clean
done; done; done
