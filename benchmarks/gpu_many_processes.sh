#!/usr/bin/env bash
# benchmarks/many_processes.py on the GPU machine (no LanceDB, no package index): installs LanceDB from a carried
# folder as gpu_soak.sh does (its header says how to prepare results/carry), builds the sidecar with CUDA, runs the
# hot-tier GPU tests (the sidecar's loop changed with the idle-spin rule), then the benchmark with the CUDA sidecar
# and, in the same call, with the CPU sidecar for the ratio. Raw vectors only: the default embedder's weights are
# not carried. Then the store with the CUDA sidecar beside the floor (--stores shared none: no store, each operation
# the CPU time of a store operation, each write a bare durable append), alternated in one sitting. Figures go to
# $OUT (JSON and PNG per device, and the floor's JSON).
#   run(command="bash benchmarks/gpu_many_processes.sh", carry=["results/carry"])
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_many_processes.log") 2>&1
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
tar xJf results/carry/lancedb.tar.xz -C "$SP" && python3 -m pip install --no-deps --no-index -q results/carry/*.whl 2>&1 | grep -v WARNING | tail -3
python3 -c "import lancedb; print('lancedb', lancedb.__version__)" || exit 1
[ -e tiered_recall/storage ] || ln -s ../storage tiered_recall/storage
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/trcuda-build.log 2>&1 \
  && ninja -C /tmp/trcuda >> /tmp/trcuda-build.log 2>&1 || { tail -20 /tmp/trcuda-build.log; exit 1; }
export TIERED_RECALL_BIN_DIR=/tmp/trcuda PYTHONPATH=$PWD PYTHONUNBUFFERED=1
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
echo "=== GPU tests ($SECONDS s)"
TR_REQUIRE_GPU=1 timeout 150 python3 -m pytest tests/native/test_batched_search.py tests/native/test_cuda_backend.py \
    tests/hot/test_sidecar.py -m gpu -q -p no:cacheprovider -ra --tb=short 2>&1 | tail -6
clean
SECS=${SECS:-8}
for device in cuda cpu; do
  echo "=== many_processes.py --device $device ($SECONDS s)"
  timeout 200 python3 benchmarks/many_processes.py --device "$device" --processes 1 2 4 8 16 --mix 95/5 70/30 \
      --seconds "$SECS" --json "$OUT/many_processes_$device.json" --png "$OUT/many_processes_$device.png" 2>&1 \
      | grep -v Warning
  clean
done
echo "=== many_processes.py --device cuda --stores shared none ($SECONDS s)"
timeout 150 python3 benchmarks/many_processes.py --device cuda --processes 2 8 16 --mix 95/5 --seconds "$SECS" \
    --stores shared none --json "$OUT/many_processes_floor.json" 2>&1 | grep -v Warning
clean
echo "=== done ($SECONDS s)"
