#!/usr/bin/env bash
# The exactness checks that need the GPU machine, in one call: the CUDA build, the GPU tests of filtered search
# against float64 (tests/native/test_cuda_filtered.py, its table printed), the sidecar's GPU tests, the randomized
# cross-process check with a CUDA worker, and the hot path of TieredMemory.search before and after (an older tree
# built beside this one, alternated, each run in its own process).
#
# LanceDB is not installed there: CARRY names a folder prepared as benchmarks/gpu_soak.sh's header says
# (lancedb.tar.xz and the wheels). OLD_TREE (optional) is a source tree of the version to compare with, e.g.
#   mkdir -p .devbuild/old && git archive <rev> | tar x -C .devbuild/old
# run(command="CARRY=.devbuild/carry OLD_TREE=.devbuild/old bash benchmarks/gpu_exactness.sh",
#     carry=[".devbuild/carry", ".devbuild/old"])
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/exactness.log") 2>&1
export PYTHONUNBUFFERED=1
TOTAL_S=${TOTAL_S:-560}
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
left() { local l=$((TOTAL_S - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
step machine
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
step "LanceDB from ${CARRY:?set CARRY}"
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
tar xJf "$CARRY/lancedb.tar.xz" -C "$SP" && python3 -m pip install --no-deps --no-index -q "$CARRY"/*.whl 2>&1 | grep -v WARNING | tail -3
python3 -c "import lancedb; print('lancedb', lancedb.__version__)" || exit 1
build() {  # build <tree> <dir>: the CUDA sidecar for sm_90, and the storage link a source tree needs on PYTHONPATH
  [ -e "$1/tiered_recall/storage" ] || ln -s ../storage "$1/tiered_recall/storage"
  cmake -S "$1/native" -B "$2" -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$2.log" 2>&1 && ninja -C "$2" >> "$2.log" 2>&1
}
step "build (sm_90)"
build "$PWD" /tmp/trnew & new=$!
if [ -n "${OLD_TREE:-}" ]; then build "$OLD_TREE" /tmp/trold & old=$!; wait $old || { echo "OLD BUILD FAILED"; tail -20 /tmp/trold.log; }; fi
wait $new || { echo "BUILD FAILED"; tail -30 /tmp/trnew.log; exit 1; }
grep -c "0 bytes spill" /tmp/trnew.log | sed 's/^/functions with 0 bytes spilled: /'
/tmp/trnew/tr-sidecar --backends
new_env=(env TIERED_RECALL_BIN_DIR=/tmp/trnew PYTHONPATH="$PWD")
step "GPU tests: filtered search against float64, the sidecar on CUDA"
TR_REQUIRE_GPU=1 timeout $(left 240) "${new_env[@]}" python3 -m pytest tests/native/test_cuda_filtered.py -m gpu -q -s \
    -p no:cacheprovider -ra --tb=short 2>&1 | tee "$OUT/filtered.log" | grep -vE "^\s*$" | tail -22
clean
TR_REQUIRE_GPU=1 timeout $(left 120) "${new_env[@]}" python3 -m pytest tests/hot/test_sidecar.py tests/native/test_cuda_backend.py \
    tests/native/test_batched_search.py -m gpu -q -p no:cacheprovider -ra --tb=short 2>&1 | tail -6
clean
step "randomized cross-process check with a CUDA worker (CI's test, then longer)"
TR_REQUIRE_GPU=1 timeout $(left 120) "${new_env[@]}" python3 -m pytest tests/coordinator/test_interleavings.py -m gpu -q \
    -p no:cacheprovider -ra --tb=short 2>&1 | tail -4
clean
timeout $(left 150) "${new_env[@]}" python3 benchmarks/interleavings.py --ops "${INTERLEAVE_OPS:-20000}" --seed 31 \
    --workers 4 --devices none cpu cuda --json "$OUT/interleavings_cuda.json" 2>&1 | tail -5
clean
step "TieredMemory.search hot path, before (OLD_TREE) and after, alternated (dim 768, cuda)"
for round in 1 2; do
  if [ -n "${OLD_TREE:-}" ] && [ -x /tmp/trold/tr-sidecar ]; then
    (cd "$OLD_TREE" && timeout $(left 100) env TIERED_RECALL_BIN_DIR=/tmp/trold PYTHONPATH="$OLD_TREE" python3 \
      "$OLDPWD/benchmarks/hot_path_checks.py" --device cuda --dim 768 --label before) | tee -a "$OUT/hot_path_cuda.jsonl"
    clean
  fi
  timeout $(left 100) "${new_env[@]}" python3 benchmarks/hot_path_checks.py --device cuda --dim 768 --label after \
    | tee -a "$OUT/hot_path_cuda.jsonl"
  clean
done
step done
