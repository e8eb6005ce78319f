"""One query's E5 embedding on the CPU through onnxruntime, graph and session variants side by side: the shipped int8
graph (DynamicQuantizeMatMul) on 1 and 2 threads, with and without spinning worker threads, at onnxruntime's basic
and full optimization levels; float32 weights; and MatMulNBits over the file's own 4-bit weights (int8 compute, and
float32). Each query runs every variant in turn, so a loaded machine slows them alike; prints p50/p90 and each
variant's cosine to float32 compute on the exact 4-bit weights.

    .venv/bin/python benchmarks/e5_cpu_graphs.py --queries 300
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from tiered_recall.embedders import E5Embedder
from tiered_recall.embedders import e5_onnx
from tiered_recall.embedders.e5 import QUERY_PREFIX
from tiered_recall.testing.locomo import DATA_FILE, DEFAULT_DATA, load_questions


def _replace_products(weights, make) -> bytes:
    """The shipped graph with each DynamicQuantizeMatMul replaced by make(node, name, matrices) -> new nodes."""
    model = e5_onnx.build_graph(weights)
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    nodes = []
    for node in graph.node:
        if node.op_type != "DynamicQuantizeMatMul":
            nodes.append(node)
            continue
        layer, kind = node.output[0].split(".")
        rows = weights.ffn if kind == "fi" else weights.hidden
        names = [f"{layer}.{m}.w" for m in "qkv"] if kind == "qkv" else [f"{layer}.{kind}.w"]
        for name in node.input[1:4]:
            graph.initializer.remove(initializers[name])
        new_nodes, new_initializers = make(node, [weights.q4_blocks(name, rows) for name in names])
        nodes += new_nodes
        graph.initializer.extend(new_initializers)
    del graph.node[:]
    graph.node.extend(nodes)
    return model.SerializeToString()


def float32_graph(weights) -> bytes:
    from onnx import helper, numpy_helper

    from tiered_recall.embedders.e5_weights import dequantize

    def make(node, blocks):
        matrix = np.concatenate([dequantize(b).reshape(b.shape[0], -1) for b in blocks]).T.astype(np.float32)
        out = node.output[0]
        return ([helper.make_node("MatMul", [node.input[0], out + ".f"], [out + ".mm"]),
                 helper.make_node("Add", [out + ".mm", node.input[4]], [out])],
                [numpy_helper.from_array(np.ascontiguousarray(matrix), out + ".f")])

    return _replace_products(weights, make)


def nbits_graph(weights, accuracy_level: int) -> bytes:
    from onnx import helper, numpy_helper

    def make(node, blocks):
        block = np.concatenate(blocks)  # (out, in / 32): byte j holds weight j (low nibble) and j + 16 (high)
        values = np.concatenate([block["nibbles"] & 0x0F, block["nibbles"] >> 4], axis=-1)
        packed = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)  # MatMulNBits: pairs in order
        out = node.output[0]
        return ([helper.make_node("MatMulNBits", [node.input[0], out + ".nb", out + ".ns", "", "", node.input[4]],
                                  [out], domain="com.microsoft", K=packed.shape[1] * 32, N=packed.shape[0], bits=4,
                                  block_size=32, accuracy_level=accuracy_level)],
                [numpy_helper.from_array(packed, out + ".nb"),
                 numpy_helper.from_array(block["scale"].astype(np.float32).reshape(-1), out + ".ns")])

    return _replace_products(weights, make)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    runtime = e5_onnx._import_runtime()
    embedder = E5Embedder(backend="onnx")
    embedder.wait_loaded()
    weights = embedder._weights
    questions = [q.text for q in load_questions(args.data / DATA_FILE)[0]][: args.queries]
    inputs = []
    for question in questions:
        ids = np.array([embedder.token_ids([question], QUERY_PREFIX)[0]])
        inputs.append({"embeddings": weights.input_embeddings(ids), "mask": np.ones(ids.shape, np.int32)})

    def session(model: bytes, threads: int, *, spin: bool = True, full: bool = False):
        options = runtime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = threads, 1, 3
        options.graph_optimization_level = (runtime.GraphOptimizationLevel.ORT_ENABLE_ALL if full else
                                            runtime.GraphOptimizationLevel.ORT_ENABLE_BASIC)
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        return runtime.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    shipped = e5_onnx.build_graph(weights).SerializeToString()
    exact = session(nbits_graph(weights, 1), 1)
    variants = {
        "int8, 1 thread (shipped)": session(shipped, 1), "int8, 2 threads": session(shipped, 2),
        "int8, 2 threads, no spinning": session(shipped, 2, spin=False),
        "int8, 1 thread, ORT_ENABLE_ALL": session(shipped, 1, full=True),
        "float32, 1 thread": session(float32_graph(weights), 1),
        "float32, 2 threads, no spinning": session(float32_graph(weights), 2, spin=False),
        "4-bit MatMulNBits, int8 compute, 1 thread": session(nbits_graph(weights, 4), 1),
        "4-bit MatMulNBits, float32 compute, 1 thread": session(nbits_graph(weights, 1), 1),
    }
    seconds = {name: [] for name in variants}
    for feed in inputs:
        for name, variant in variants.items():
            t0 = time.perf_counter()
            variant.run(None, feed)
            seconds[name].append(time.perf_counter() - t0)
    reference = [exact.run(None, feed)[0][0] for feed in inputs[:100]]
    print(f"{len(inputs)} dev questions, {len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.1f}")
    for name, variant in variants.items():
        vectors = [variant.run(None, feed)[0][0] for feed in inputs[:100]]
        cosine = min(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(vectors, reference))
        ms = np.array(seconds[name]) * 1e3
        print(f"{name:46s} p50 {np.percentile(ms, 50):7.3f} ms  p90 {np.percentile(ms, 90):7.3f} ms  "
              f"min cosine {cosine:.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
