#!/usr/bin/env bash
# The TieredMemory soak (benchmarks/soak.py) with the CUDA sidecar on the GPU machine, which has no LanceDB
# and no package index: installs LanceDB and its pure-Python dependencies from a carried folder, builds the
# sidecar, runs the soak and prints its summary (GPU memory before / after / after close is in the JSON).
#
# Prepare the folder here (lancedb's wheel is 75 MB, over the 64 MiB a device call may carry; its files
# repacked with xz are 41 MB), then carry it: run(command="bash benchmarks/gpu_soak.sh", carry=["results/carry"])
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux2014_x86_64 -d /tmp/whl lancedb==0.40.0 lance-namespace lance-namespace-urllib3-client \
#     deprecation overrides pydantic pydantic-core typing-inspection annotated-types threadpoolctl tqdm urllib3 \
#     python-dateutil six
#   mkdir -p results/carry /tmp/whl/x && (cd /tmp/whl/x && unzip -q ../lancedb-*.whl && tar cf - . | xz -9 -T2 \
#     > "$OLDPWD/results/carry/lancedb.tar.xz") && cp /tmp/whl/*.whl results/carry/ && rm results/carry/lancedb-*.whl
# SOAK_OPS (default 100000) sets --ops; the store reaches FAISS's 20,000-row threshold only past ~500k operations,
# and faiss is not carried.
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_soak.log") 2>&1
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
tar xJf results/carry/lancedb.tar.xz -C "$SP" && python3 -m pip install --no-deps --no-index -q results/carry/*.whl 2>&1 | grep -v WARNING | tail -3
python3 -c "import lancedb, pyarrow, numpy; print('lancedb', lancedb.__version__, 'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__)" || exit 1
# the package maps storage/ to tiered_recall.storage when installed; a source checkout on PYTHONPATH needs the link
[ -e tiered_recall/storage ] || ln -s ../storage tiered_recall/storage
cmake -S native -B /tmp/trcuda -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/trcuda-build.log 2>&1 \
  && ninja -C /tmp/trcuda >> /tmp/trcuda-build.log 2>&1 || { tail -20 /tmp/trcuda-build.log; exit 1; }
export TIERED_RECALL_BIN_DIR=/tmp/trcuda PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 540 python3 benchmarks/soak.py --processes 8 --ops "${SOAK_OPS:-100000}" --warmup 300 --device cuda \
  --bounded-allocators > "$OUT/soak_cuda.json" 2> "$OUT/soak_cuda.err"
echo "soak rc=$?"
tail -5 "$OUT/soak_cuda.err"
pkill -9 -f tr-sidecar 2>/dev/null; true
