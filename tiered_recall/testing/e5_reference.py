"""multilingual-e5-small in float64 with numpy, as the model is written: what the tests hold each encoder (torch,
libtrencoder's kernel, libtrcpuencoder) against."""
from __future__ import annotations

import math

import numpy as np


def norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis."""
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


def attention(qkv: np.ndarray, heads: int) -> np.ndarray:
    """One text's self-attention: (tokens, 3 hidden) query / key / value columns -> (tokens, hidden)."""
    tokens, width = qkv.shape
    q, k, v = (part.reshape(tokens, heads, -1).transpose(1, 0, 2) for part in np.split(qkv, 3, axis=1))
    logits = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return (weights @ v).transpose(1, 0, 2).reshape(tokens, width // 3)


_erf = np.vectorize(math.erf)


def gelu(x: np.ndarray) -> np.ndarray:
    """The exact GELU, 0.5 x (1 + erf(x / sqrt 2))."""
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def random_ids(weights, length: int, rng: np.random.Generator) -> list[int]:
    """A text of `length` token ids as the model reads one: <s>, random pieces, </s>."""
    return [weights.bos, *rng.integers(5, weights.vocabulary, size=length - 2).tolist(), weights.eos]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two vectors (any shape, flattened), in float64."""
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def model_as_written(weights, ids: list[int]) -> np.ndarray:
    """multilingual-e5-small's mean-pooled last hidden states in float64, each bias where the model has it."""
    x = weights.input_embeddings(np.array([ids])).astype(np.float64)[0]
    x = norm(x, weights.f32("emb.ln.w"), weights.f32("emb.ln.b"), weights.eps)
    for layer in range(weights.layers):
        p = f"l{layer}"

        def dense(name: str, rows: int, source: np.ndarray) -> np.ndarray:
            return source @ weights.matrix(f"{p}.{name}.w", rows).T.astype(np.float64) + weights.f32(f"{p}.{name}.b")

        qkv = np.concatenate([dense(m, weights.hidden, x) for m in "qkv"], axis=1)
        attended = dense("ao", weights.hidden, attention(qkv, weights.heads))
        x = norm(x + attended, weights.f32(f"{p}.aln.w"), weights.f32(f"{p}.aln.b"), weights.eps)
        inner = gelu(dense("fi", weights.ffn, x))
        x = norm(x + dense("fo", weights.hidden, inner), weights.f32(f"{p}.oln.w"), weights.f32(f"{p}.oln.b"),
                  weights.eps)
    return x.mean(axis=0)
