#!/usr/bin/env bash
# One GPU-machine call for the pipelined / zero-copy CUDA search: build report (sm_90), GPU tests,
# the benchmark (768 only), compute-sanitizer memcheck + racecheck with the sidecar itself started
# under the sanitizer (a wrapper tr-sidecar in the bin dir). Each stage has its own time limit;
# everything lands in $OUT (at most 8 files).
#   bash benchmarks/gpu_pipeline_session.sh
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TIERED_RECALL_BIN_DIR=/tmp/trcuda
exec > >(tee -a "$OUT/session.log") 2>&1
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
step machine
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1; nproc
step "build (nvcc -Xptxas -v, sm_90)"
timeout ${BUILD_S:-150} bash -c "cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 && ninja -C /tmp/trcuda" \
  > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | sed 's/ptxas info    : //' | paste - - - | cut -c1-200
/tmp/trcuda/tr-sidecar --backends
STAGES="${STAGES:-tests bench san}"
if [[ $STAGES == *tests* ]]; then
step "GPU tests (TR_REQUIRE_GPU=1)"
TR_REQUIRE_GPU=1 TR_CUDA_VERBOSE=1 timeout ${TEST_S:-150} python3 -m pytest tests/test_batched_search.py tests/test_cuda_backend.py \
    tests/test_sidecar.py -m gpu -q -p no:cacheprovider --timeout 120 -ra 2>&1 | tee "$OUT/tests.log" | tail -30
fi
if [[ $STAGES == *bench* ]]; then
step "benchmark (hot_latency.py --backend cuda -> hot_latency_cuda.py)"
timeout ${BENCH_S:-200} python3 benchmarks/hot_latency.py --backend cuda --dims 768 --json "$OUT/hot_latency_cuda.json" \
    --png "$OUT/hot_latency_cuda.png" 2>&1 | tee "$OUT/bench.log" | grep -vE "^\s*$"
fi
[[ $STAGES == *san* ]] || { step done; exit 0; }
step "compute-sanitizer (--target-processes all, one log per process)"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
rm -rf /tmp/sanlogs; mkdir -p /tmp/sanlogs
for TOOL in memcheck racecheck; do
  echo "--- $TOOL"
  # --target-processes all follows the sidecar child; %p gives each process its own log, so the
  # sidecar's own summary (and its pid) shows it was instrumented
  timeout ${SAN_S:-75} "$CS" --tool $TOOL --target-processes all --print-level info \
      --log-file /tmp/sanlogs/$TOOL-sidecar-%p.txt python3 benchmarks/cuda_sanitize_workload.py; echo "workload rc=$?"
  for f in /tmp/sanlogs/$TOOL-sidecar-*.txt; do
    echo "$f: $(grep -c . "$f") lines; $(grep -m1 -oE 'Target application.*|COMPUTE-SANITIZER' "$f")"
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|Device not supported|Invalid|Race|Hazard|Program hit" "$f" | sort | uniq -c | head -10
  done
done
for f in /tmp/sanlogs/*.txt; do echo "##### $f"; head -c 200000 "$f"; done > "$OUT/sanitizer.log" 2>/dev/null
step done
