#!/usr/bin/env bash
# One GPU-machine call for the batched CUDA search: build report (sm_90), GPU tests, the benchmark,
# compute-sanitizer memcheck + racecheck on a small workload. Each stage has its own time limit so
# the whole run stays inside one 10-minute call; everything lands in $OUT (at most 8 files).
#   bash benchmarks/gpu_batch_session.sh [bench args...]
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TIERED_RECALL_BIN_DIR=/tmp/trcuda
exec > >(tee -a "$OUT/session.log") 2>&1
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
step machine
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1; nproc
step "build (nvcc -Xptxas -v, sm_90)"
cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 && \
  ninja -C /tmp/trcuda >> "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | sed 's/ptxas info    : //' | paste - - - | cut -c1-220
/tmp/trcuda/tr-sidecar --backends
step "GPU tests (TR_REQUIRE_GPU=1)"
TR_REQUIRE_GPU=1 timeout ${TEST_S:-200} python3 -m pytest tests/test_batched_search.py tests/test_cuda_backend.py \
    tests/test_sidecar.py -m gpu -q -p no:cacheprovider --timeout 150 -ra 2>&1 | tee "$OUT/tests.log" | tail -30
step "benchmark"
timeout ${BENCH_S:-210} python3 benchmarks/hot_latency_cuda.py --json "$OUT/hot_latency_cuda.json" "$@" 2>&1 | tee "$OUT/bench.log"
step "compute-sanitizer"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for TOOL in memcheck racecheck; do
  echo "--- $TOOL"
  timeout ${SAN_S:-70} "$CS" --tool $TOOL --target-processes all --log-file "$OUT/san-$TOOL.txt" \
      python3 benchmarks/cuda_sanitize_workload.py; echo "rc=$?"
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|Device not supported|Invalid|Race|Hazard" "$OUT/san-$TOOL.txt" | sort | uniq -c | head -20
done
cat "$OUT"/san-*.txt > "$OUT/sanitizer.log" 2>/dev/null; rm -f "$OUT"/san-*.txt
step done
