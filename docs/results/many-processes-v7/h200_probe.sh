set -uo pipefail
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
tar xJf results/carry/lancedb.tar.xz -C "$SP" && python3 -m pip install --no-deps --no-index -q results/carry/*.whl 2>&1 | grep -v WARNING | tail -3
[ -e tiered_recall/storage ] || ln -s ../storage tiered_recall/storage
cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/b.log 2>&1 && ninja -C /tmp/trcuda >> /tmp/b.log 2>&1 || { tail -20 /tmp/b.log; exit 1; }
export TIERED_RECALL_BIN_DIR=/tmp/trcuda PYTHONPATH=$PWD PYTHONUNBUFFERED=1
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
echo "=== device none, store and floor"
timeout 120 python3 benchmarks/many_processes.py --device none --processes 8 16 --mix 95/5 --seconds 6 --stores shared none --json $OUT/none_floor.json 2>&1 | grep -v Warning | python3 -c "
import json,sys
for l in sys.stdin:
    if not l.startswith('{'): print(l.rstrip()); continue
    d=json.loads(l); print({k:d.get(k) for k in ['stores','processes','aggregate_ops_per_s','worker_cpu_ms_per_op','search_p99_ms','add_p50_ms','add_p99_ms','add_own_p99_ms','add_cores_given_mean']})"
clean
for dev in none cuda; do
echo "=== probe, device $dev, 16 processes"
timeout 120 python3 docs/results/many-processes-v7/add_block_sites.py --device $dev --processes 16 --mix 95/5 --seconds 6 2>&1 | grep -v '^{' | grep -v Warning
clean
done
