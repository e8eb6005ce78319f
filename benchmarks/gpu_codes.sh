#!/usr/bin/env bash
# The int8 codes on the GPU machine, in one call: the build (sm_90; -Xptxas -v: registers and spills of the codes'
# kernels), the codes' GPU tests (ids and scores against the f16 scan, float64), the benchmark (codes against the f16
# scan, PyTorch and the floor: benchmarks/codes_latency.py --backend cuda), filtered search against float64 with the
# codes on (test_cuda_filtered.py: 100k and 1M rows take the codes), then the other GPU tests in the time left.
# Each stage has its own limit (TOTAL_S overall); stray sidecars are killed between stages; logs land in $OUT.
#
# BIN (optional): a folder with tr-sidecar, libtrcuda.so, libtrclient.so and _trfast built here beforehand for sm_90;
# used when it runs on this machine, else the tree is built here.
#   run(command="cd .stage/int8 && BIN=$PWD/bin bash benchmarks/gpu_codes.sh", carry=[".stage/int8"])
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec > >(tee -a "$OUT/codes_session.log") 2>&1
TOTAL_S=${TOTAL_S:-540}
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
left() { local l=$((TOTAL_S - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
step machine
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; nvcc --version | tail -1; nproc
usable() {  # the binaries in $1 run here: the CUDA backend loads and the search fast path imports
  [ -x "$1/tr-sidecar" ] && "$1/tr-sidecar" --backends 2>/dev/null | grep -qw cuda &&
    TIERED_RECALL_BIN_DIR="$1" python3 -W error -c "from tiered_recall.hot.native import fast_search_module as f; assert f()"
}
if [ -n "${BIN:-}" ] && usable "$BIN"; then
  echo "binaries: $BIN (built beforehand)"
else
  step "build (nvcc -Xptxas -v, sm_90)"
  BIN=/tmp/trcodes
  timeout $(left 150) bash -c "cmake -S native -B $BIN -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DPython_EXECUTABLE=$(command -v python3) && ninja -C $BIN" > "$OUT/build.log" 2>&1 \
    || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
  grep -A3 -E "Compiling entry function '_Z1[0-9](code_scan|code_merge)" "$OUT/build.log" | grep -E "registers|spill" | sed 's/ptxas info    : //'
  usable "$BIN" || { echo "the build does not run here"; exit 1; }
fi
export TIERED_RECALL_BIN_DIR="$BIN"
step "the codes' GPU tests (TR_REQUIRE_GPU=1)"
TR_REQUIRE_GPU=1 timeout $(left 150) python3 -m pytest tests/native/test_cuda_codes.py -m gpu -q -p no:cacheprovider -ra \
    --tb=short 2>&1 | tee "$OUT/codes_tests.log" | tail -25
clean
step "benchmark: codes against the f16 scan, PyTorch and the floor (100k, 1M x 768)"
timeout $(left 200) python3 benchmarks/codes_latency.py --backend cuda ${BENCH_ARGS:-} --json "$OUT/codes_latency_cuda.json" \
    2>&1 | tee "$OUT/codes_bench.log" | grep -vE "^\s*$"
clean
step "filtered search against float64, codes on (test_cuda_filtered.py)"
TR_REQUIRE_GPU=1 timeout $(left 150) python3 -m pytest tests/native/test_cuda_filtered.py -m gpu -q -s -p no:cacheprovider \
    -ra --tb=short 2>&1 | tee "$OUT/filtered.log" | grep -vE "^\s*$" | tail -16
clean
step "the other GPU tests (time left: $((TOTAL_S - SECONDS))s)"
[ $((TOTAL_S - SECONDS)) -gt 30 ] && TR_REQUIRE_GPU=1 timeout $(left 150) python3 -m pytest tests/native/test_batched_search.py \
    tests/native/test_cuda_backend.py tests/hot/test_sidecar.py -m gpu -q -p no:cacheprovider -ra --tb=short 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -12
clean
step done
