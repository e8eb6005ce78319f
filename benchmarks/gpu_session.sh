#!/usr/bin/env bash
# The whole GPU-machine run for the CUDA backend: build report, install, GPU tests, compute-sanitizer
# (memcheck, racecheck) on a small workload, the latency/QPS benchmark; everything lands in $OUT.
#
#   bash benchmarks/gpu_session.sh [all|check|bench] [extra hot_latency.py args...]
#     check: build + install + tests + sanitizers;  bench: install (if needed) + benchmark;  all: both
set -uo pipefail
STAGE="${1:-all}"; shift || true
OUT="${OUT:-$PWD/results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TR_CUDA=ON
PY=python3
LOG="$OUT/session.log"
exec > >(tee -a "$LOG") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }

step "machine"
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
nvcc --version | tail -2; $PY -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'

install() {
  step "build report (nvcc -Xptxas -v)"
  cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON > "$OUT/build.log" 2>&1 && \
    ninja -C /tmp/trcuda >> "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
  grep -E "Compiling entry|registers|spill" "$OUT/build.log"
  step "pip install -e ."
  $PY -m pip install -q --no-build-isolation --no-deps -e . >> "$OUT/build.log" 2>&1 || { echo "INSTALL FAILED"; tail -30 "$OUT/build.log"; exit 1; }
  $PY -c 'from tiered_recall._native import sidecar_executable as s; import subprocess; p=str(s()); print(p, subprocess.run([p,"--backends"],capture_output=True,text=True).stdout)'
}

if [ "$STAGE" = all ] || [ "$STAGE" = check ]; then
  install
  step "GPU tests (TR_REQUIRE_GPU=1)"
  TR_REQUIRE_GPU=1 timeout 420 $PY -m pytest tests/test_cuda_backend.py tests/test_sidecar.py -m gpu -q \
      -p no:cacheprovider --timeout 180 -ra 2>&1 | tee "$OUT/tests.log" | tail -40
  step "compute-sanitizer"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for TOOL in memcheck racecheck; do
    echo "--- $TOOL"
    # --target-processes all: the sidecar is a child of the Python workload
    timeout 400 "$CS" --tool $TOOL --target-processes all --log-file "$OUT/sanitizer-$TOOL.txt" \
        $PY benchmarks/cuda_sanitize_workload.py
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|Device not supported|Invalid|Race" "$OUT/sanitizer-$TOOL.txt" | head -20
  done
  cat "$OUT"/sanitizer-*.txt > "$OUT/sanitizer.log" 2>/dev/null; rm -f "$OUT"/sanitizer-*.txt
fi

if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
  [ "$STAGE" = bench ] && { $PY -c 'import tiered_recall.sidecar' 2>/dev/null && [ -e build ] || install; }
  step "benchmark"
  $PY benchmarks/hot_latency.py --backend cuda --json "$OUT/hot_latency_cuda.json" --png "$OUT/hot_latency_cuda.png" "$@" \
      2>&1 | tee "$OUT/bench.log"
fi
step "done"
