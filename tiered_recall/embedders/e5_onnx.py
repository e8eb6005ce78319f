"""Runs the E5 encoder on the CPU through onnxruntime: the graph is built from the shipped weights, with int8 weights
(one scale per output column) and int8 activations quantized per call (DynamicQuantizeMatMul), once per machine:
later processes read it from the user's cache folder (building it takes the onnx package and most of a second)."""
from __future__ import annotations

import hashlib
import logging
import os
import threading

import numpy as np

from ..errors import InvalidInput
from .e5_weights import E5_INSTALL_HINT, E5Weights, int8_columns

OPSET = 17
# The IR version the graph declares: the onnx package writes its newest by default, which an older onnxruntime
# refuses ("Unsupported model IR version"); 8 is what opset 17 needs, read by every onnxruntime this supports.
IR_VERSION = 8
FEW_TOKENS = 256  # a forward pass over at most this many tokens (batch x length) runs on the query session
# Tokens per forward pass when embedding many texts: large enough to keep the matrix units busy, small enough that
# the activations stay in cache.
BATCH_TOKENS = 2048
# Changes whenever build_graph makes a different graph from the same weights: the cached graph of another builder
# is then never read.
GRAPH_BUILDER = "e5-onnx-int8-v1"
CACHE_FOLDER_NAME = "e5-onnx"

logger = logging.getLogger("tiered_recall")


def _import_runtime():
    # onnxruntime's Linux builds carry a telemetry client that writes a session file into the temporary folder at
    # import; a storage library has no business reporting anything, so it is off unless the user turned it on.
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    try:
        import onnxruntime
    except ImportError as error:
        raise InvalidInput(f"the E5 embedder's CPU backend needs {error.name}, which is not installed; "
                           f"{E5_INSTALL_HINT}") from None
    if os.environ["ORT_DISABLE_TELEMETRY"] == "1":
        onnxruntime.disable_telemetry_events()  # for an application that imported onnxruntime before this
    return onnxruntime


def _import_onnx():
    try:
        import onnx
    except ImportError as error:
        raise InvalidInput(f"building the E5 graph needs {error.name}, which is not installed; {E5_INSTALL_HINT}"
                           ) from None
    return onnx


def cache_folder() -> str:
    """Where built graphs are kept: the user's cache folder (XDG_CACHE_HOME), tiered-recall/e5-onnx."""
    from platformdirs import user_cache_dir

    return os.path.join(user_cache_dir("tiered-recall"), CACHE_FOLDER_NAME)


def _cache_key(weights: E5Weights) -> str:
    """The weights file (by path, size and modification time) and the builder: a new file or builder, a new key."""
    stat = os.stat(weights.path)
    source = f"{GRAPH_BUILDER}|{os.path.realpath(weights.path)}|{stat.st_size}|{stat.st_mtime_ns}|{OPSET}|{IR_VERSION}"
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def cached_graph(weights: E5Weights) -> tuple[str, bytes | None]:
    """(where the graph of these weights is cached, its bytes or None when it is not there)."""
    path = os.path.join(cache_folder(), _cache_key(weights) + ".onnx")
    try:
        with open(path, "rb") as cached:
            return path, cached.read()
    except FileNotFoundError:
        return path, None


def built_graph(weights: E5Weights, path: str) -> bytes:
    """The serialized graph built (build_graph) and kept at `path` for the next process: whole or absent, whichever
    process writes it. A cache that cannot be written only costs the next process the build again."""
    model = build_graph(weights).SerializeToString()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        partial = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(partial, "wb") as out:
            out.write(model)
        os.replace(partial, path)
    except OSError as error:
        logger.debug("tiered-recall: the E5 graph could not be cached at %s (%s): the next process builds it again",
                     path, error)
    return model


def _session(onnxruntime, model: bytes, threads: int):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # onnxruntime's warnings go to stderr, past the application's logging
    # The graph is built fused already; the extended levels would re-fuse Add + LayerNormalization into the slower
    # SkipLayerNormalization.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def build_graph(weights: E5Weights):
    """The encoder as an ONNX model: inputs `embeddings` (batch, tokens, hidden) float32 (word + position + type,
    before the embedding LayerNorm) and `mask` (batch, tokens) int32; output `summed`, the masked sum of the last
    hidden states (mean pooling divides by the token count outside)."""
    _import_onnx()
    from onnx import TensorProto, helper, numpy_helper

    hidden, ffn, heads = weights.hidden, weights.ffn, weights.heads
    initializers, nodes = [], []

    def constant(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def linear(source: str, weight: np.ndarray, bias: np.ndarray, out: str) -> str:
        quantized, scale = int8_columns(weight)
        nodes.append(helper.make_node(
            "DynamicQuantizeMatMul",
            [source, constant(f"{out}.w", quantized), constant(f"{out}.scale", scale),
             constant(f"{out}.zero", np.zeros(scale.shape, np.int8)),
             constant(f"{out}.b", np.asarray(bias, np.float32))],
            [out], domain="com.microsoft"))
        return out

    def norm_with_residual(source: str, residual: str, prefix: str, out: str) -> str:
        # Add and LayerNormalization, not the fused SkipLayerNormalization contrib kernel, which is the slower of the
        # two on x86 CPUs (docs/recall.md)
        nodes.append(helper.make_node("Add", [source, residual], [f"{out}.sum"]))
        nodes.append(helper.make_node(
            "LayerNormalization",
            [f"{out}.sum", constant(f"{out}.g", weights.f32(f"{prefix}.w")),
             constant(f"{out}.beta", weights.f32(f"{prefix}.b"))],
            [out], axis=-1, epsilon=weights.eps))
        return out

    nodes.append(helper.make_node("LayerNormalization", ["embeddings", constant("emb.ln.w", weights.f32("emb.ln.w")),
                                                         constant("emb.ln.b", weights.f32("emb.ln.b"))],
                                  ["x0"], axis=-1, epsilon=weights.eps))
    x = "x0"
    for layer in range(weights.layers):
        p = f"l{layer}"
        qkv_weight = np.concatenate([weights.matrix(f"{p}.{m}.w", hidden) for m in "qkv"])
        qkv_bias = np.concatenate([weights.f32(f"{p}.{m}.b") for m in "qkv"])
        qkv = linear(x, qkv_weight, qkv_bias, f"{p}.qkv")
        nodes.append(helper.make_node("Split", [qkv, constant(f"{p}.split", np.array([hidden] * 3, np.int64))],
                                      [f"{p}.q", f"{p}.k", f"{p}.v"], axis=-1))
        nodes.append(helper.make_node("MultiHeadAttention", [f"{p}.q", f"{p}.k", f"{p}.v", "", "mask"], [f"{p}.ctx"],
                                      domain="com.microsoft", num_heads=heads))
        attended = linear(f"{p}.ctx", weights.matrix(f"{p}.ao.w", hidden), weights.f32(f"{p}.ao.b"), f"{p}.ao")
        x1 = norm_with_residual(attended, x, f"{p}.aln", f"{p}.x1")
        inner = linear(x1, weights.matrix(f"{p}.fi.w", ffn), weights.f32(f"{p}.fi.b"), f"{p}.fi")
        nodes.append(helper.make_node("Gelu", [inner], [f"{p}.gelu"], domain="com.microsoft"))
        outer = linear(f"{p}.gelu", weights.matrix(f"{p}.fo.w", hidden), weights.f32(f"{p}.fo.b"), f"{p}.fo")
        x = norm_with_residual(outer, x1, f"{p}.oln", f"{p}.x2")
    nodes.append(helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Unsqueeze", ["mask_f", constant("last_axis", np.array([-1], np.int64))], ["mask_3d"]))
    nodes.append(helper.make_node("Mul", [x, "mask_3d"], ["masked"]))
    nodes.append(helper.make_node("ReduceSum", ["masked", constant("token_axis", np.array([1], np.int64))], ["summed"],
                                  keepdims=0))
    graph = helper.make_graph(
        nodes, "multilingual-e5-small",
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", "tokens", hidden]),
         helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "tokens"])],
        [helper.make_tensor_value_info("summed", TensorProto.FLOAT, ["batch", hidden])], initializers)
    return helper.make_model(graph, ir_version=IR_VERSION,
                             opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])


class OnnxEncoder:
    """The encoder in two onnxruntime sessions on the CPU, which share nothing but the graph: one for a few texts
    (a query) on one core fewer than this process may use, at most four (a CPU hot tier's sidecar polls on a core
    right after it answers, and one query's small matrices gain little from more threads), and one for batches on
    every core, at most eight, made when the first batch comes (a process that only searches never needs it).
    `threads` sets both."""

    batch_tokens = BATCH_TOKENS

    def __init__(self, weights: E5Weights, *, threads: int | None = None) -> None:
        self._runtime = _import_runtime()
        cores = len(os.sched_getaffinity(0))
        self.threads = (threads or min(4, max(1, cores - 1)), threads or min(8, cores))
        path, model = cached_graph(weights)
        session = None
        if model is not None:
            try:
                session = _session(self._runtime, model, self.threads[0])
            except Exception as error:  # a torn or foreign file: built again and replaced
                logger.warning("tiered-recall: the cached E5 graph %s could not be loaded (%s); building it again",
                               path, error)
        if session is None:
            model = built_graph(weights, path)
            session = _session(self._runtime, model, self.threads[0])
        self._weights = weights
        self._model, self._query_session = model, session
        self._batch_session = None
        self._batch_lock = threading.Lock()

    def mean_pooled(self, token_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, tokens) int64 ids padded with the pad id, and their int32 mask -> (batch, hidden) float32 means
        of the last hidden states over each text's tokens."""
        embeddings = self._weights.input_embeddings(token_ids)
        if token_ids.shape[0] * token_ids.shape[1] <= FEW_TOKENS:
            session = self._query_session
        else:
            session = self._batch_session
            if session is None:
                with self._batch_lock:
                    if self._batch_session is None:
                        self._batch_session = _session(self._runtime, self._model, self.threads[1])
                    session = self._batch_session
        (summed,) = session.run(None, {"embeddings": embeddings, "mask": mask})
        return summed / mask.sum(axis=1, keepdims=True)

    def one(self, ids: list[int]) -> np.ndarray:
        """One text's token ids -> (1, hidden) float32, its mean-pooled vector."""
        row = np.asarray([ids], dtype=np.int64)
        return self.mean_pooled(row, np.ones(row.shape, dtype=np.int32))
