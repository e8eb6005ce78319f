"""Smoke test of an installed wheel (run by .ci/wheel, from a folder outside the checkout): the package and its native
parts come from site-packages, the fast path is the stable-ABI build, the sidecar serves from the asked device, and a
store answers exactly (hot tier against numpy). Prints one JSON line of figures.

    python wheel_smoke.py [--device cpu|cuda] [--expect-cuda-build]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--expect-cuda-build", action="store_true",
                        help="fail unless the wheel carries the CUDA backend (libtrcuda.so) and the sidecar loads it, and the "
                             "fused E5 query encoder (libtrencoder.so)")
    args = parser.parse_args()

    import tiered_recall
    from tiered_recall import TieredMemory
    from tiered_recall.hot import native

    package = Path(tiered_recall.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert site in package.parents, f"tiered_recall imported from {package}, not from the installed wheel in {site}"
    binaries = package / "_bin"
    shipped = sorted(p.name for p in binaries.iterdir())
    for name in ("tr-sidecar", "libtrclient.so", "_trfast.abi3.so", "_trstages.abi3.so"):
        assert name in shipped, f"the wheel has no {name} (it has {shipped})"
    fast = native.fast_search_module()
    assert fast is not None and fast.__file__.endswith(".abi3.so"), "the stable-ABI search fast path did not load"
    from tiered_recall.coordinator.stages import compiled_stages
    loops = compiled_stages()
    assert loops is not None and loops.__file__.endswith(".abi3.so"), "the stable-ABI compiled stages did not load"
    if platform.machine() in ("x86_64", "AMD64"):
        assert "libtrcpuencoder.so" in shipped, f"no E5 CPU encoder (libtrcpuencoder.so) in an x86-64 wheel: {shipped}"
        from tiered_recall.embedders.e5_cpu import ABI_VERSION as CPU_ABI, cpu_encoder_library

        assert cpu_encoder_library().tr_cpu_encoder_abi_version() == CPU_ABI, "libtrcpuencoder.so is from another build"
    backends = subprocess.run([str(binaries / "tr-sidecar"), "--backends"], capture_output=True, text=True,
                              check=True).stdout.split()
    if args.expect_cuda_build or args.device == "cuda":
        assert "libtrcuda.so" in shipped and "cuda" in backends, f"no CUDA backend: {shipped}, backends {backends}"
        assert "libtrencoder.so" in shipped, f"no fused E5 query encoder beside the CUDA backend: {shipped}"
        from tiered_recall.embedders.e5_fused import ABI_VERSION, encoder_library

        assert encoder_library().tr_encoder_abi_version() == ABI_VERSION, "libtrencoder.so is from another build"

    rng = np.random.default_rng(7)
    dim, rows, k = 256, 2000, 10
    vectors = rng.standard_normal((rows, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with tempfile.TemporaryDirectory() as folder, TieredMemory(Path(folder) / "store", dim=dim, embedder=None,
                                                               device=args.device, hot_capacity=4096) as memory:
        ids = np.asarray(memory.add([f"memory {i}" for i in range(rows)], vectors=vectors, namespace="smoke"))
        queries = rng.standard_normal((200, dim), dtype=np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        seconds, rules = [], set()
        for q in queries:
            started = time.perf_counter()
            report = memory.search(q, k=k, namespace="smoke", explain=True)
            seconds.append(time.perf_counter() - started)
            rules.add(report.rule)
            expected = set(ids[np.argsort(-(vectors @ q), kind="stable")[:k]].tolist())
            got = {hit.id for hit in report}
            # f16 rows on CUDA may swap a near tie at the k-th place; float32 on the CPU agrees exactly
            assert len(got & expected) >= (k if args.device == "cpu" else k - 1), f"search disagrees with numpy: {sorted(got ^ expected)}"
            assert all(hit.tier == "hot" for hit in report), [hit.tier for hit in report]
            one_pass = memory.search(q, k=k, namespace="smoke")  # the hot answer's one pass, its hits built in C
            assert one_pass == report.hits and [h.__dict__ for h in one_pass] == [h.__dict__ for h in report.hits]
        stats = memory.stats()
    assert stats["hot_backend"] == args.device, f"the hot tier is served by {stats['hot_backend']!r}"
    print(json.dumps({
        "python": sys.version.split()[0], "version": tiered_recall.__version__, "device": args.device,
        "backends": backends, "hot_backend": stats["hot_backend"], "rules": sorted(rules),
        "search_p50_us": round(float(np.median(seconds)) * 1e6, 1),
        "search_p99_us": round(float(np.percentile(seconds, 99)) * 1e6, 1), "shipped": shipped,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
