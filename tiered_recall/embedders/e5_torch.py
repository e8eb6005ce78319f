"""Runs the E5 encoder through torch: on a CUDA GPU in float16, where one query is one launch of the fused encoder
kernel (e5_fused) or, without it, one replayed CUDA graph that reads its token ids and does everything else on the
device (the word-embedding lookup, the twelve layers with fused attention, pooling and normalisation); or on the CPU
in bfloat16 where the CPU has AMX (docs/recall.md)."""
from __future__ import annotations

import threading
import warnings

import numpy as np

from ..errors import InvalidInput
from .e5_fused import MAX_TOKENS as FUSED_MAX_TOKENS
from .e5_fused import QUERY_PATHS, FusedEncoderUnavailable, FusedQueryEncoder
from .e5_weights import E5Weights

# One query's tokens are padded up to a multiple of this: one captured graph per multiple, from it to
# QUERY_GRAPH_TOKENS, all captured while the encoder loads; a longer query runs eagerly.
QUERY_GRAPH_STEP = 8
QUERY_GRAPH_TOKENS = 128
# Tokens per forward pass when embedding many texts on a GPU: enough rows to fill its matrix units.
GPU_BATCH_TOKENS = 16384
CPU_BATCH_TOKENS = 2048


def _import_torch():
    try:
        import torch
    except ImportError:
        raise InvalidInput("the E5 embedder's torch backend needs torch, which is not installed: pip install torch "
                           "(or use backend='onnx' on the CPU)") from None
    return torch


def folded_layers(weights: E5Weights) -> tuple[tuple[np.ndarray, np.ndarray], list[dict[str, np.ndarray]]]:
    """The embedding layer norm and the layers' weights (float64) with the two output projections' biases moved into
    the layer norms before them, so that each residual sum is one matrix product that adds into its input.

    The residual stream a layer norm hands on carries the next projection's bias already (beta + b): the product
    `addmm(x + b, h, W)` is then x + b + hW, what the model computes, and the projections that read the same stream
    take it back off their own bias (b_in - W_in b). Returns ((gamma, beta), layers) where each layer holds qkv,
    qkv_b, ao, fi, fi_b, fo, aln (gamma, beta), oln (gamma, beta); the last layer's output norm keeps its beta."""
    def f64(name: str) -> np.ndarray:
        return weights.f32(name).astype(np.float64)

    hidden, count = weights.hidden, weights.layers
    raw = []
    for layer in range(count):
        p = f"l{layer}"
        raw.append({
            "qkv": np.concatenate([weights.matrix(f"{p}.{m}.w", hidden) for m in "qkv"]).astype(np.float64),
            "qkv_b": np.concatenate([f64(f"{p}.{m}.b") for m in "qkv"]),
            "ao": weights.matrix(f"{p}.ao.w", hidden).astype(np.float64), "ao_b": f64(f"{p}.ao.b"),
            "fi": weights.matrix(f"{p}.fi.w", weights.ffn).astype(np.float64), "fi_b": f64(f"{p}.fi.b"),
            "fo": weights.matrix(f"{p}.fo.w", hidden).astype(np.float64), "fo_b": f64(f"{p}.fo.b"),
            "aln": (f64(f"{p}.aln.w"), f64(f"{p}.aln.b")), "oln": (f64(f"{p}.oln.w"), f64(f"{p}.oln.b")),
        })
    embedding_norm = (f64("emb.ln.w"), f64("emb.ln.b") + raw[0]["ao_b"])
    layers = []
    for index, layer in enumerate(raw):
        next_ao_b = raw[index + 1]["ao_b"] if index + 1 < count else np.zeros(hidden)
        layers.append({
            "qkv": layer["qkv"], "qkv_b": layer["qkv_b"] - layer["qkv"] @ layer["ao_b"],
            "ao": layer["ao"],
            "aln": (layer["aln"][0], layer["aln"][1] + layer["fo_b"]),
            "fi": layer["fi"], "fi_b": layer["fi_b"] - layer["fi"] @ layer["fo_b"],
            "fo": layer["fo"],
            "oln": (layer["oln"][0], layer["oln"][1] + next_ao_b),
        })
    return embedding_norm, layers


def _position_and_type(weights: E5Weights) -> np.ndarray:
    """(max_positions, hidden) float32: each position's vector plus the one token type's."""
    positions = weights.f32("emb.pos").reshape(weights.max_positions, weights.hidden)
    return positions + weights.f32("emb.type")[: weights.hidden]


class TorchEncoder:
    """The encoder as torch tensors on `device` ("cuda", "cuda:N" or "cpu"), in `dtype` (a torch dtype; default
    float16 on a GPU, bfloat16 on the CPU). queries: how a GPU runs one query, "fused" (libtrencoder's kernel),
    "graphs" (captured CUDA graphs) or "auto" (fused where the library is installed and runs on this GPU, else
    graphs); `query_path` says which it is."""

    def __init__(self, weights: E5Weights, *, device: str = "cuda", dtype=None, queries: str = "auto") -> None:
        if queries not in QUERY_PATHS:
            raise InvalidInput(f"gpu_queries must be one of {QUERY_PATHS}, got {queries!r}")
        torch = _import_torch()
        self._torch = torch
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidInput("backend='torch' on device='cuda' but torch sees no CUDA GPU; use device='cpu' or "
                               "backend='onnx'")
        self.device = torch.device(device)
        self.on_gpu = self.device.type == "cuda"
        self._device_index = None
        if self.on_gpu:
            self._device_index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.device = torch.device("cuda", self._device_index)
        self.dtype = dtype or (torch.float16 if self.on_gpu else torch.bfloat16)
        self.batch_tokens = GPU_BATCH_TOKENS if self.on_gpu else CPU_BATCH_TOKENS
        self._weights = weights
        self.heads, self.hidden, self.eps, self.pad = weights.heads, weights.hidden, weights.eps, weights.pad

        def tensor(array: np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(self.device, self.dtype)

        embedding_norm, layers = folded_layers(weights)
        self._embedding_norm = tuple(tensor(a) for a in embedding_norm)
        # Matrices kept transposed, (in, out): addmm(bias, x, W) then reads them as stored.
        self._layers = [{
            "qkv": tensor(layer["qkv"].T), "qkv_b": tensor(layer["qkv_b"]), "ao": tensor(layer["ao"].T),
            "aln": tuple(tensor(a) for a in layer["aln"]),
            "fi": tensor(layer["fi"].T), "fi_b": tensor(layer["fi_b"]), "fo": tensor(layer["fo"].T),
            "oln": tuple(tensor(a) for a in layer["oln"]),
        } for layer in layers]
        position_and_type = _position_and_type(weights)
        self._position_and_type = tensor(position_and_type)
        self._word_table = None
        self._fused = None
        self._graphs: dict[int, tuple] = {}
        # One query at a time: the graphs' inputs and outputs are fixed buffers (searches may come from several
        # threads).
        self._replay_lock = threading.Lock()
        if self.on_gpu:
            # The whole word-embedding table on the device, dequantized once: a query's lookup is one gather there.
            table = torch.empty((weights.vocabulary, self.hidden), dtype=self.dtype, device=self.device)
            chunk = 16384
            for start in range(0, weights.vocabulary, chunk):
                rows = np.arange(start, min(start + chunk, weights.vocabulary))
                table[start:start + len(rows)] = torch.from_numpy(weights.word_vectors(rows)).to(self.device,
                                                                                                 self.dtype)
            self._word_table = table
            self._pinned_ids = torch.full((QUERY_GRAPH_TOKENS,), self.pad, dtype=torch.int64).pin_memory()
            self._pinned_ids_view = self._pinned_ids.numpy()
            self._pinned_out = torch.empty((self.hidden,), dtype=torch.float32).pin_memory()
            self._pinned_out_view = self._pinned_out.numpy()
            self._fused = self._query_kernel(position_and_type, embedding_norm, layers, queries)
            if self._fused is None:
                self._capture_graphs()
            self._warm_batches()
        self.query_path = "fused" if self._fused is not None else "graphs" if self.on_gpu else "cpu"

    def _warm_batches(self) -> None:
        """Runs one padded batch of passages: the first batch on a GPU pays for the math libraries' setup and the
        loading of their kernels, which belongs to the load, not to an ingest's first batch."""
        rows, tokens = self.batch_tokens // 64, 64
        token_ids = np.full((rows, tokens), self.pad, dtype=np.int64)
        mask = np.zeros((rows, tokens), dtype=np.int32)
        for row in range(rows):
            length = tokens - row % 16  # some rows padded: the masked attention's kernels load too
            token_ids[row, :length] = self._weights.bos
            mask[row, :length] = 1
        self.mean_pooled(token_ids, mask)

    def fused_encoder(self, blocks: int = 0) -> FusedQueryEncoder:
        """Another fused query encoder over this encoder's weights (on a GPU), on `blocks` thread blocks (0: one per
        multiprocessor); the tests and benchmarks/e5_fused.py run the kernel on other grids with it."""
        if not self.on_gpu:
            raise InvalidInput("the fused query encoder runs on a GPU: make the TorchEncoder with device='cuda'")
        embedding_norm, layers = folded_layers(self._weights)
        return self._new_fused(_position_and_type(self._weights), embedding_norm, layers, blocks)

    def _new_fused(self, position_and_type: np.ndarray, embedding_norm, layers, blocks: int) -> FusedQueryEncoder:
        return FusedQueryEncoder(self._torch, self.device, word_table=self._word_table, positions=position_and_type,
                                 embedding_norm=embedding_norm, layers=layers, eps=self.eps, blocks=blocks)

    def _query_kernel(self, position_and_type: np.ndarray, embedding_norm, layers, queries: str):
        """The fused kernel's encoder, or None for graphs: where asked for, or (auto) where libtrencoder is not
        installed or cannot run here."""
        if queries == "graphs":
            return None
        try:
            return self._new_fused(position_and_type, embedding_norm, layers, 0)
        except FusedEncoderUnavailable as error:
            if queries == "fused":
                raise
            if error.installed:  # a build without the CUDA toolkit has no fused encoder: that is no surprise
                warnings.warn(f"{error}; queries are embedded by CUDA graphs instead", RuntimeWarning, stacklevel=2)
            return None

    def _capture_graphs(self) -> None:
        torch = self._torch
        self._pool = torch.cuda.graph_pool_handle()
        # no_grad, not inference_mode: a query copies its ids into the graphs' inputs outside inference mode
        with torch.no_grad(), torch.cuda.device(self.device):
            for tokens in range(QUERY_GRAPH_STEP, QUERY_GRAPH_TOKENS + 1, QUERY_GRAPH_STEP):
                self._capture(tokens)

    # ---- the model -------------------------------------------------------------------------------------------------
    def _input_embeddings(self, token_ids):
        """(batch, tokens) int64 ids on the device -> the embedding layer's input (word + position + type)."""
        functional = self._torch.nn.functional
        tokens = token_ids.shape[1]
        return functional.embedding(token_ids, self._word_table) + self._position_and_type[:tokens]

    def _layers_forward(self, x, additive_mask):
        """x (batch, tokens, hidden) before the embedding layer norm -> the last hidden states. additive_mask:
        (batch, 1, 1, tokens), 0 for a token and -inf for padding, or None when nothing is padded."""
        torch, functional = self._torch, self._torch.nn.functional
        batch, tokens, hidden = x.shape
        heads = self.heads
        x = functional.layer_norm(x, (hidden,), *self._embedding_norm, self.eps).view(batch * tokens, hidden)
        for layer in self._layers:
            qkv = torch.addmm(layer["qkv_b"], x, layer["qkv"]).view(batch, tokens, 3, heads, hidden // heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            context = functional.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask)
            context = context.transpose(1, 2).reshape(batch * tokens, hidden)
            x = functional.layer_norm(torch.addmm(x, context, layer["ao"]), (hidden,), *layer["aln"], self.eps)
            inner = functional.gelu(torch.addmm(layer["fi_b"], x, layer["fi"]))
            x = functional.layer_norm(torch.addmm(x, inner, layer["fo"]), (hidden,), *layer["oln"], self.eps)
        return x.view(batch, tokens, hidden)

    def _masked(self, token_ids):
        """The additive attention mask (batch, heads, tokens, tokens) and the pooling weights (1 / tokens for a token,
        0 for padding) of padded ids."""
        torch = self._torch
        batch, tokens = token_ids.shape
        valid = token_ids != self.pad
        # Rows 16-element aligned, the other dimensions broadcast: the fused attention kernel reads the mask as it is
        # instead of padding a copy of it in every layer.
        width = -(-tokens // 16) * 16
        additive = torch.zeros((batch, width), dtype=self.dtype, device=valid.device)
        additive[:, :tokens].masked_fill_(~valid, float("-inf"))
        counts = valid.sum(dim=1, keepdim=True)
        mask = additive[:, None, None, :tokens].expand(batch, self.heads, tokens, tokens)
        return mask, valid.to(torch.float32) / counts

    def _pooled(self, token_ids):
        """Padded ids (batch, tokens) on the device -> (batch, hidden) float32 means over each text's tokens."""
        additive, pool_weights = self._masked(token_ids)
        hidden_states = self._layers_forward(self._input_embeddings(token_ids), additive)
        return (hidden_states.float() * pool_weights[..., None]).sum(dim=1)

    # ---- what E5Embedder calls ---------------------------------------------------------------------------------------
    def mean_pooled(self, token_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, tokens) int64 ids padded with the pad id, and their mask -> (batch, hidden) float32 means of the
        last hidden states over each text's tokens."""
        torch = self._torch
        with torch.inference_mode():
            if not self.on_gpu:
                x = torch.from_numpy(self._weights.input_embeddings(token_ids)).to(self.dtype)
                hidden_states = self._layers_forward(x, self._cpu_mask(mask))
                m = torch.from_numpy(mask).to(torch.float32)
                return ((hidden_states.float() * m[..., None]).sum(dim=1) / m.sum(dim=1, keepdim=True)).numpy()
            ids = torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64)).to(self.device, non_blocking=True)
            with self._batch_attention():
                return self._pooled(ids).cpu().numpy()

    def _batch_attention(self):
        """Attention for a batch without cuDNN's: torch may send attention with a padding mask to cuDNN first, which
        builds an execution plan for every (batch, tokens) it has not seen, on the CPU, and ingest's batches come in
        many shapes (docs/recall.md). The memory-efficient kernel takes the mask as it is, with no plan to build.
        While this runs, torch's attention choice is narrowed for the whole process."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])

    def _cpu_mask(self, mask: np.ndarray):
        torch = self._torch
        if mask.all():
            return None
        additive = torch.zeros(mask.shape, dtype=self.dtype).masked_fill_(torch.from_numpy(mask == 0), float("-inf"))
        return additive[:, None, None, :]

    def one(self, ids: list[int]) -> np.ndarray:
        """One text's token ids -> (1, hidden) float32, its mean-pooled vector (unit length on a GPU)."""
        tokens = len(ids)
        if self._fused is not None and tokens <= FUSED_MAX_TOKENS:
            return self._fused.one(ids)
        if not self.on_gpu or tokens > QUERY_GRAPH_TOKENS:
            row = np.asarray([ids], dtype=np.int64)
            return self.mean_pooled(row, np.ones(row.shape, dtype=np.int32))
        size = -(-tokens // QUERY_GRAPH_STEP) * QUERY_GRAPH_STEP
        graph, static_ids, pinned_ids, static_out = self._graphs[size]
        torch = self._torch
        with self._replay_lock:
            buffer = self._pinned_ids_view
            buffer[:tokens] = ids
            buffer[tokens:size] = self.pad
            if torch.cuda.current_device() != self._device_index:
                with torch.cuda.device(self.device):
                    return self._replay(graph, static_ids, pinned_ids, static_out)
            return self._replay(graph, static_ids, pinned_ids, static_out)

    def _replay(self, graph, static_ids, pinned_ids, static_out) -> np.ndarray:
        static_ids.copy_(pinned_ids, non_blocking=True)
        graph.replay()
        self._pinned_out.copy_(static_out, non_blocking=True)
        self._torch.cuda.current_stream().synchronize()
        return self._pinned_out_view.copy()[None]

    def _capture(self, tokens: int) -> None:
        """Captures the graph of one query padded to `tokens`: ids in, the unit mean-pooled vector out."""
        torch = self._torch
        static_ids = torch.full((1, tokens), self.pad, dtype=torch.int64, device=self.device)
        static_ids[0, 0] = self._weights.bos

        def forward():
            pooled = self._pooled(static_ids)[0]
            return pooled / pooled.norm()

        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graph capture requires
            forward()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the load thread captures while the application may use CUDA on other threads
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            static_out = forward()
        self._graphs[tokens] = (graph, static_ids[0], self._pinned_ids[:tokens], static_out)
