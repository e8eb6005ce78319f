#!/usr/bin/env bash
# Everything the CUDA backend needs checked, in one GPU-machine call: build report (sm_90, spills),
# GPU tests (TR_REQUIRE_GPU=1), the persistent kernel's stage profile (persist_profile.py), the
# benchmark (BENCH_ARGS, default dim 768 at 4096 / 100k / 1M rows, plus QPS with 1/4/16 clients at
# 100k) with the persistent kernel and again launching per request (--cuda-persist off,
# LAUNCH_BENCH_ARGS), gpu_sanitize.sh (memcheck + racecheck on the sidecar process), then the GPU
# tests launching per request, in what time is left. Each stage has its own limit (TOTAL_S
# overall); stray sidecars are killed between stages; at most 8 files land in $OUT.
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TIERED_RECALL_BIN_DIR=/tmp/trcuda
exec > >(tee -a "$OUT/session.log") 2>&1
TOTAL_S=${TOTAL_S:-540}
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
left() { local l=$((TOTAL_S - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
step machine
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; nvcc --version | tail -1
step "build (nvcc -Xptxas -v, sm_90)"
timeout $(left 90) bash -c "cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 && ninja -C /tmp/trcuda" \
  > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | sed 's/ptxas info    : //' | paste - - - | cut -c1-220
/tmp/trcuda/tr-sidecar --backends
step "GPU tests (TR_REQUIRE_GPU=1)"
TR_REQUIRE_GPU=1 timeout $(left 150) python3 -m pytest tests/native/test_batched_search.py tests/native/test_cuda_backend.py \
    tests/hot/test_sidecar.py -m gpu -q -p no:cacheprovider -ra --tb=short 2>&1 | tee "$OUT/tests.log" | tail -15
clean
step "persistent kernel stage profile (persist_profile.py)"
timeout $(left 75) python3 benchmarks/persist_profile.py --rows 4096 100000 1000000 --dim 768 2>&1 | tail -20
clean
step "benchmark 768 (hot_latency.py --backend cuda; persistent kernel)"
timeout $(left 130) python3 benchmarks/hot_latency.py --backend cuda ${BENCH_ARGS:---dims 768 --rows 4096 100000 1000000} \
    --json "$OUT/hot_latency_cuda.json" --png "$OUT/hot_latency_cuda.png" 2>&1 | tee "$OUT/bench.log" | grep -vE "^\s*$"
clean
step "the same, launching per request (--cuda-persist off), for the ratio"
timeout $(left 75) python3 benchmarks/hot_latency.py --backend cuda --cuda-persist off ${LAUNCH_BENCH_ARGS:---dims 768 --rows 4096 100000 --clients 16} \
    --json "$OUT/hot_latency_cuda_launch.json" 2>&1 | grep -vE "^\s*$" | tail -8
clean
step "gpu_sanitize.sh (memcheck + racecheck on the sidecar)"
rm -rf /tmp/san; OUT=/tmp/san timeout $(left 90) bash benchmarks/gpu_sanitize.sh; echo "gpu_sanitize rc=$?"
for f in /tmp/san/*.log; do echo "##### $f"; head -c 100000 "$f"; done > "$OUT/sanitizer.log" 2>/dev/null
clean
step "GPU tests launching per request (--cuda-persist off; time left: $((TOTAL_S - SECONDS))s)"
[ $((TOTAL_S - SECONDS)) -gt 20 ] && TR_REQUIRE_GPU=1 timeout $(left 90) python3 -m pytest --cuda-persist off \
    tests/native/test_batched_search.py tests/native/test_cuda_backend.py -m gpu -q -p no:cacheprovider -ra 2>&1 | tail -8
clean
step done
