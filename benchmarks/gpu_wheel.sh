#!/usr/bin/env bash
# The wheel on the GPU machine, in one call: the repaired wheel that .ci/wheel builds (no GPU at build time), installed
# unchanged in a fresh venv, must serve from the CUDA backend: its sidecar's backends, .ci/wheel_smoke.py --device
# cuda, the demo on cuda, the GPU tests against the wheel's binaries, and hot_latency.py --backend cuda with the
# wheel's binaries (every architecture, loaded libtrcuda.so) beside a source build for sm_90 alone, alternated.
#
# WHEEL is the repaired wheel; CARRY a folder with lancedb.tar.xz (the lancedb wheel's files, xz-compressed to fit
# the 64 MiB a call carries) and the small wheels it and the package need (numpy, pyarrow and torch are there):
#   mkdir -p .devbuild/carry && cp dist/*.whl .devbuild/carry/    # after .ci/wheel; then lancedb as gpu_soak.sh says
#   run(command="WHEEL=.devbuild/carry/tiered_recall-*.whl CARRY=.devbuild/carry bash benchmarks/gpu_wheel.sh",
#       carry=[".devbuild/carry"])
set -uo pipefail
REPO=$PWD
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/wheel.log") 2>&1
export PYTHONUNBUFFERED=1
TOTAL_S=${TOTAL_S:-570}
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
left() { local l=$((TOTAL_S - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
clean() { pkill -9 -f tr-sidecar 2>/dev/null; sleep 0.3; rm -f /dev/shm/tiered-recall.* 2>/dev/null; true; }
step machine
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 --version
WHEEL=$(ls $WHEEL)  # the glob, expanded here
step "the wheel: $(basename "$WHEEL") $(sha256sum "$WHEEL" | cut -c1-16)"
cmake -S native -B /tmp/src90 -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/src90.log 2>&1 \
  && ninja -C /tmp/src90 >> /tmp/src90.log 2>&1 & build=$!   # the comparison build, meanwhile
python3 -m venv --system-site-packages /tmp/wv || exit 1
SP=$(/tmp/wv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# numpy, pyarrow, torch, cupy and pytest live outside the system site folder there: a .pth names their folders.
python3 -c 'import os, numpy, pyarrow, torch, cupy, pytest
print("\n".join(sorted({os.path.dirname(os.path.dirname(m.__file__)) for m in (numpy, pyarrow, torch, cupy, pytest)})))' > "$SP/gpu_machine.pth"
cat "$SP/gpu_machine.pth"
tar xJf "$CARRY/lancedb.tar.xz" -C "$SP" || exit 1
/tmp/wv/bin/python -m pip install -q --no-deps --no-index "$CARRY"/*.whl 2>&1 | grep -v WARNING | tail -3
/tmp/wv/bin/python -c "import lancedb, tiered_recall; print('lancedb', lancedb.__version__, 'tiered_recall', tiered_recall.__version__, tiered_recall.__file__)" || exit 1
BIN=$SP/tiered_recall/_bin
ls -la "$BIN"
step "the wheel's sidecar"
"$BIN/tr-sidecar" --backends
mkdir -p /tmp/away && cd /tmp/away  # outside the checkout: everything comes from the venv
step "wheel_smoke.py --device cuda --expect-cuda-build"
timeout $(left 90) /tmp/wv/bin/python "$REPO/.ci/wheel_smoke.py" --device cuda --expect-cuda-build | tee "$OUT/wheel_smoke_cuda.json"
clean
step "demo on cuda"
if /tmp/wv/bin/python -c "import wordllama" 2>/dev/null; then
  timeout $(left 90) env XDG_DATA_HOME=/tmp/away/data COLUMNS=160 /tmp/wv/bin/tiered-recall demo --device cuda | tail -16
else  # the demo embeds text; wordllama and tokenizers do not fit beside LanceDB in one call's 64 MiB
  echo "(skipped: wordllama is not installed there; carry it instead of what this call does not need)"
fi
clean
cd "$REPO"
step "GPU tests with the wheel's binaries"
TR_REQUIRE_GPU=1 TIERED_RECALL_BIN_DIR="$BIN" timeout $(left 200) /tmp/wv/bin/python -m pytest tests/hot/test_sidecar.py \
    tests/native/test_cuda_backend.py tests/native/test_cuda_filtered.py tests/native/test_batched_search.py -m gpu -q \
    -p no:cacheprovider -ra --tb=short 2>&1 | tail -8
clean
wait $build || { echo "SOURCE BUILD FAILED"; tail -20 /tmp/src90.log; }
step "hot_latency.py --backend cuda: the wheel's binaries and a source build for sm_90, alternated"
cd /tmp/away
for round in 1 2; do
  for side in wheel src90; do
    bin=$BIN; [ $side = src90 ] && bin=/tmp/src90
    [ -x "$bin/tr-sidecar" ] || continue
    [ $((TOTAL_S - SECONDS)) -lt 70 ] && { echo "(out of time: round $round $side skipped)"; continue; }
    echo "--- $side, round $round"
    timeout $(left 80) env TIERED_RECALL_BIN_DIR="$bin" /tmp/wv/bin/python "$REPO/benchmarks/hot_latency.py" \
      --backend cuda --dims 768 --rows 4096 100000 1000000 --queries 800 --clients 1 16 --qps-seconds 2 \
      --json "$OUT/hot_latency_${side}_${round}.json" 2>&1 | grep -vE "^\s*$" | tail -9
    clean
  done
done
step done
