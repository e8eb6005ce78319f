#!/usr/bin/env bash
# Everything the CUDA backend needs checked, in one GPU-machine call: build report (sm_90, spills),
# GPU tests (TR_REQUIRE_GPU=1), the benchmark (BENCH_ARGS, default dim 768 at 4096 / 100k / 1M
# rows, plus QPS with 1/4/16 clients at 100k), gpu_sanitize.sh (memcheck + racecheck on the sidecar
# process), then the batched-search tests with every pass fused (TR_CUDA_FUSE_MAX=16) and with none
# (TR_CUDA_FUSE_MAX=0), in what time is left. Each stage has its own limit (TOTAL_S overall); at
# most 7 files land in $OUT.
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TIERED_RECALL_BIN_DIR=/tmp/trcuda
exec > >(tee -a "$OUT/session.log") 2>&1
TOTAL_S=${TOTAL_S:-315}
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
left() { local l=$((TOTAL_S - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
step machine
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; nvcc --version | tail -1
step "build (nvcc -Xptxas -v, sm_90)"
timeout $(left 90) bash -c "cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 && ninja -C /tmp/trcuda" \
  > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | sed 's/ptxas info    : //' | paste - - - | cut -c1-220
/tmp/trcuda/tr-sidecar --backends
step "GPU tests (TR_REQUIRE_GPU=1)"
TR_REQUIRE_GPU=1 timeout $(left 110) python3 -m pytest tests/test_batched_search.py tests/test_cuda_backend.py \
    tests/test_sidecar.py -m gpu -q -p no:cacheprovider -ra 2>&1 | tee "$OUT/tests.log" | tail -15
step "benchmark 768 (hot_latency.py --backend cuda)"
timeout $(left 105) python3 benchmarks/hot_latency.py --backend cuda ${BENCH_ARGS:---dims 768 --rows 4096 100000 1000000} \
    --json "$OUT/hot_latency_cuda.json" 2>&1 | tee "$OUT/bench.log" | grep -vE "^\s*$"
step "gpu_sanitize.sh (memcheck + racecheck on the sidecar)"
rm -rf /tmp/san; OUT=/tmp/san timeout $(left 75) bash benchmarks/gpu_sanitize.sh; echo "gpu_sanitize rc=$?"
for f in /tmp/san/*.log; do echo "##### $f"; head -c 100000 "$f"; done > "$OUT/sanitizer.log" 2>/dev/null
step "batched tests, all fused / none fused (time left: $((TOTAL_S - SECONDS))s)"
for F in 16 0; do
  [ $((TOTAL_S - SECONDS)) -gt 15 ] || { echo "no time left for TR_CUDA_FUSE_MAX=$F"; continue; }
  echo "--- TR_CUDA_FUSE_MAX=$F"
  TR_CUDA_FUSE_MAX=$F TR_REQUIRE_GPU=1 timeout $(left 60) python3 -m pytest tests/test_batched_search.py \
      tests/test_cuda_backend.py -m gpu -q -x -p no:cacheprovider 2>&1 | tail -4
done 2>&1 | tee "$OUT/variants.log"
step done
