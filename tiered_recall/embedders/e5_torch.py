"""Runs the E5 encoder through torch: on a CUDA GPU in float16 (one query replays a captured CUDA graph, so its
latency is not a hundred kernel launches), or on the CPU in bfloat16 where the CPU has AMX."""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInput
from .e5_weights import E5Weights

# A single query's token count is padded up to one of these, so one captured graph serves every query of that size.
QUERY_GRAPH_TOKENS = (16, 32, 64, 128)


def _import_torch():
    try:
        import torch
    except ImportError:
        raise InvalidInput("the E5 embedder's torch backend needs torch, which is not installed: pip install torch "
                           "(or use backend='onnx' on the CPU)") from None
    return torch


class TorchEncoder:
    """The encoder as torch tensors on `device` ("cuda", "cuda:N" or "cpu")."""

    def __init__(self, weights: E5Weights, *, device: str = "cuda") -> None:
        torch = _import_torch()
        self._torch = torch
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidInput("backend='torch' on device='cuda' but torch sees no CUDA GPU; use device='cpu' or "
                               "backend='onnx'")
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        self.heads, self.hidden, self.eps = weights.heads, weights.hidden, weights.eps

        def tensor(array: np.ndarray):
            # a copy: the weights are read-only views of the mapped file, which torch will not wrap
            return torch.from_numpy(np.array(array, dtype=np.float32)).to(self.device, self.dtype)

        self._embedding_norm = (tensor(weights.f32("emb.ln.w")), tensor(weights.f32("emb.ln.b")))
        self._layers = []
        for layer in range(weights.layers):
            p = f"l{layer}"
            self._layers.append({
                "qkv": tensor(np.concatenate([weights.matrix(f"{p}.{m}.w", weights.hidden) for m in "qkv"])),
                "qkv_b": tensor(np.concatenate([weights.f32(f"{p}.{m}.b") for m in "qkv"])),
                "ao": tensor(weights.matrix(f"{p}.ao.w", weights.hidden)), "ao_b": tensor(weights.f32(f"{p}.ao.b")),
                "fi": tensor(weights.matrix(f"{p}.fi.w", weights.ffn)), "fi_b": tensor(weights.f32(f"{p}.fi.b")),
                "fo": tensor(weights.matrix(f"{p}.fo.w", weights.hidden)), "fo_b": tensor(weights.f32(f"{p}.fo.b")),
                "aln": (tensor(weights.f32(f"{p}.aln.w")), tensor(weights.f32(f"{p}.aln.b"))),
                "oln": (tensor(weights.f32(f"{p}.oln.w")), tensor(weights.f32(f"{p}.oln.b"))),
            })
        self._graphs: dict[int, tuple] = {}

    def _forward(self, embeddings, mask):
        torch, functional = self._torch, self._torch.nn.functional
        batch, tokens, hidden = embeddings.shape
        x = functional.layer_norm(embeddings, (hidden,), *self._embedding_norm, self.eps)
        keep = mask[:, None, None, :].to(torch.bool)
        for layer in self._layers:
            q, k, v = functional.linear(x, layer["qkv"], layer["qkv_b"]).view(
                batch, tokens, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
            context = functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            attended = functional.linear(context.transpose(1, 2).reshape(batch, tokens, hidden), layer["ao"], layer["ao_b"])
            x = functional.layer_norm(x + attended, (hidden,), *layer["aln"], self.eps)
            inner = functional.gelu(functional.linear(x, layer["fi"], layer["fi_b"]))
            x = functional.layer_norm(x + functional.linear(inner, layer["fo"], layer["fo_b"]), (hidden,), *layer["oln"],
                                      self.eps)
        return (x.float() * mask[..., None].float()).sum(dim=1)

    def summed(self, embeddings: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, hidden) masked sums of the last hidden states, as float32 numpy."""
        torch = self._torch
        with torch.inference_mode():
            if self.device.type == "cuda" and embeddings.shape[0] == 1 and embeddings.shape[1] <= QUERY_GRAPH_TOKENS[-1]:
                return self._one_query(embeddings, mask)
            x = torch.from_numpy(embeddings).to(self.device, self.dtype, non_blocking=True)
            m = torch.from_numpy(mask).to(self.device, non_blocking=True)
            return self._forward(x, m).cpu().numpy()

    def _one_query(self, embeddings: np.ndarray, mask: np.ndarray) -> np.ndarray:
        torch = self._torch
        tokens = embeddings.shape[1]
        size = next(size for size in QUERY_GRAPH_TOKENS if size >= tokens)
        if size not in self._graphs:
            static_x = torch.zeros((1, size, self.hidden), device=self.device, dtype=self.dtype)
            static_mask = torch.zeros((1, size), device=self.device, dtype=torch.int32)
            static_mask[0, 0] = 1
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graph capture requires
                for _ in range(2):
                    self._forward(static_x, static_mask)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self._forward(static_x, static_mask)
            self._graphs[size] = (graph, static_x, static_mask, static_out)
        graph, static_x, static_mask, static_out = self._graphs[size]
        padded = np.zeros((1, size, self.hidden), dtype=np.float32)
        padded[:, :tokens] = embeddings
        padded_mask = np.zeros((1, size), dtype=np.int32)
        padded_mask[:, :tokens] = mask
        static_x.copy_(torch.from_numpy(padded))
        static_mask.copy_(torch.from_numpy(padded_mask))
        graph.replay()
        return static_out.cpu().numpy()
