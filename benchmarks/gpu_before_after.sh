#!/usr/bin/env bash
# A change checked on the GPU machine against the version before it, in one call: both trees built for sm_90, every
# kernel's SASS compared (native/tools/compare_sass.sh), every GPU test of this tree, then
# `benchmarks/hot_latency.py --backend cuda` of each tree alternated (each run its own sidecar and process), and
# the randomized cross-process check with a CUDA worker in the time left.
#
# OLD_TREE is a source tree of the version before (mkdir -p .devbuild/old && git archive REV | tar x -C
# .devbuild/old); CARRY a folder with LanceDB prepared as benchmarks/gpu_soak.sh's header says (the tests of the
# coordinator need it).
# run(command="OLD_TREE=$PWD/.devbuild/old CARRY=.devbuild/carry bash benchmarks/gpu_before_after.sh",
#     carry=[".devbuild/carry", ".devbuild/old"])
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/before_after.log") 2>&1
export PYTHONUNBUFFERED=1
TOTAL_S=${TOTAL_S:-570}
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
left() { local l=$((TOTAL_S - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
step machine
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
tar xJf "${CARRY:?set CARRY}/lancedb.tar.xz" -C "$SP" && python3 -m pip install --no-deps --no-index -q "$CARRY"/*.whl 2>&1 | grep -v WARNING | tail -3
build() {  # build <tree> <dir>
  [ -e "$1/tiered_recall/storage" ] || ln -s ../storage "$1/tiered_recall/storage"
  cmake -S "$1/native" -B "$2" -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$2.log" 2>&1 && ninja -C "$2" >> "$2.log" 2>&1
}
step "build both trees (sm_90)"
build "$PWD" /tmp/trnew & new=$!
build "${OLD_TREE:?set OLD_TREE}" /tmp/trold & old=$!
wait $old || { echo "OLD BUILD FAILED"; tail -20 /tmp/trold.log; }
wait $new || { echo "BUILD FAILED"; tail -30 /tmp/trnew.log; exit 1; }
grep -c "0 bytes spill stores, 0 bytes spill loads" /tmp/trnew.log | sed 's/^/entries with 0 spills: /'
step "SASS of every kernel, old against new"
bash native/tools/compare_sass.sh /tmp/trold /tmp/trnew | tail -20
new_env=(env TIERED_RECALL_BIN_DIR=/tmp/trnew PYTHONPATH="$PWD")
old_env=(env TIERED_RECALL_BIN_DIR=/tmp/trold PYTHONPATH="$OLD_TREE")
step "every GPU test (TR_REQUIRE_GPU=1 pytest -m gpu)"
TR_REQUIRE_GPU=1 timeout $(left 300) "${new_env[@]}" python3 -m pytest tests -m gpu -q -p no:cacheprovider -ra \
    --tb=short 2>&1 | tee "$OUT/gpu_tests.log" | grep -vE "^\s*$" | tail -12
clean
step "hot_latency.py --backend cuda, old and new alternated"
for round in 1 2; do
  for side in old new; do
    if [ $side = old ]; then tree="$OLD_TREE"; envs=("${old_env[@]}"); else tree="$PWD"; envs=("${new_env[@]}"); fi
    echo "--- round $round: $side"
    (cd "$tree" && timeout $(left 75) "${envs[@]}" python3 benchmarks/hot_latency.py --backend cuda --dims 768 \
        --rows 4096 100000 1000000 --queries 800 --clients 1 16 --qps-seconds 2 --json "$OUT/hot_latency_${side}_${round}.json") \
        2>&1 | grep -vE "^\s*$" | tail -9
    clean
  done
done
step "randomized cross-process check with a CUDA worker (time left: $((TOTAL_S - SECONDS)) s)"
[ $((TOTAL_S - SECONDS)) -gt 60 ] && timeout $(left 200) "${new_env[@]}" python3 benchmarks/interleavings.py \
    --ops "${INTERLEAVE_OPS:-6000}" --seed 41 --workers 3 --devices none cpu cuda 2>&1 | grep -v "^tiered-recall:" | tail -4
clean
step done
