#!/usr/bin/env bash
# The cluster on the GPU machine (16 cores, one GPU, Python 3.12, no package index, no Ray and no LanceDB): the GPU
# shard test, then benchmarks/cluster.py with CPU-sidecar shards (1, 2, 4) and with the GPU shard, the object storage
# a folder (moto and boto3 are not carried). Ray's wheel (76 MiB) is over the 64 MiB one call may carry: its files,
# repacked with xz and split, travel over two calls, made back to back (ignored paths stay while the machine is warm):
#   STAGE=stash  keeps .devbuild/cluster1 (the first part of ray.tar.xz) in .devbuild/stash and builds the CUDA
#                sidecar (sm_90) into .devbuild/trbuild
#   STAGE=run    puts ray.tar.xz together with the second part from .devbuild/cluster2, installs it, LanceDB (packed
#                as benchmarks/gpu_soak.sh packs it) and the small wheels, runs the GPU test and the benchmark
# Prepare the two folders here (Python 3.12 wheels, the device README's pip download; the versions this venv has):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d /tmp/whl \
#     ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py lancedb==0.40.0 lance-namespace \
#     lance-namespace-urllib3-client deprecation overrides pydantic pydantic-core typing-inspection annotated-types \
#     platformdirs
#   mkdir -p .devbuild/cluster1 .devbuild/cluster2 /tmp/whl/ray /tmp/whl/lance
#   (cd /tmp/whl/ray && unzip -q ../ray-2.60.0-*.whl && tar cf - . | xz -6 -T2 > ../ray.tar.xz)      # ~65 MB
#   (cd /tmp/whl/lance && unzip -q ../lancedb-*.whl && tar cf - . | xz -9 -T2 > ../lancedb.tar.xz)   # ~41 MB
#   split -b 48m /tmp/whl/ray.tar.xz .devbuild/cluster1/ray.tar.xz.    # .aa (48 MiB) here, with the small wheels
#   mv .devbuild/cluster1/ray.tar.xz.ab /tmp/whl/lancedb.tar.xz .devbuild/cluster2/    # ~14 MB + ~41 MB there
#   cp /tmp/whl/*.whl .devbuild/cluster1/ && rm .devbuild/cluster1/ray-*.whl .devbuild/cluster1/lancedb-*.whl
# Then: run(command="STAGE=stash bash benchmarks/gpu_cluster.sh", carry=[".devbuild/cluster1"]) and at once
#       run(command="STAGE=run bash benchmarks/gpu_cluster.sh", carry=[".devbuild/cluster2"], timeout_s=600)
set -uo pipefail
OUT="${OUT:-$PWD/results/gpu}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/cluster_${STAGE:?set STAGE}.log") 2>&1
export PYTHONUNBUFFERED=1
STASH=.devbuild/stash SITE=$PWD/.devbuild/site
mkdir -p "$STASH" "$SITE"
export PYTHONPATH="$PWD:$SITE" TIERED_RECALL_BIN_DIR=$PWD/.devbuild/trbuild
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
[ -e tiered_recall/storage ] || ln -s ../storage tiered_recall/storage
case "$STAGE" in
stash)
  step machine; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  cp .devbuild/cluster1/* "$STASH"/ && ls -la "$STASH"
  step "build (sm_90)"
  cmake -S native -B .devbuild/trbuild -G Ninja -DTR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 \
    && ninja -C .devbuild/trbuild >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  .devbuild/trbuild/tr-sidecar --backends ;;
run)
  step install
  cat "$STASH"/ray.tar.xz.aa .devbuild/cluster2/ray.tar.xz.ab | xz -d | tar xf - -C "$SITE" || exit 1
  xz -d < .devbuild/cluster2/lancedb.tar.xz | tar xf - -C "$SITE" || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$STASH"/*.whl 2>&1 | grep -v WARNING | tail -3
  python3 -c "import ray, lancedb; print('ray', ray.__version__, 'lancedb', lancedb.__version__)" || exit 1
  step "the GPU shard test"
  TR_REQUIRE_GPU=1 timeout 240 python3 -m pytest tests/cluster/test_cluster_gpu.py -q -p no:cacheprovider -ra \
    --tb=short 2>&1 | tail -8
  step "benchmark: CPU-sidecar shards 1, 2, 4; 8 client processes"
  timeout 360 python3 benchmarks/cluster.py --storage folder --device cpu --clients 8 --threads 4 --namespaces 32 \
    --scaling-rows 500 --rows 10000 --repeat 3 --seconds 8 --client-start-s 10 --json "$OUT/cluster_cpu.json"
  step "benchmark: the GPU shard (search figures)"
  timeout 120 python3 benchmarks/cluster.py --storage folder --device cuda --skip scaling durability --rows 10000 \
    --repeat 3 --json "$OUT/cluster_cuda.json" ;;
esac
pkill -9 -f tr-sidecar 2>/dev/null
step done
