"""GGUF files (llama.cpp's format) -> a Llama-architecture model: a Llama or a Qwen2, one row per architecture.

What it adds over safetensors.py: a file that carries its own hyperparameters
and tokenizer in a metadata table, and quantized tensors. specdec reads GGUF
to run real Llama-architecture models (SmolLM2, Qwen2) in NumPy; every weight is
dequantized to float32 once, at load, and the model is float32 from then on.
The file itself (header, metadata, tensor table, dequantization) is read by
gguf_file.py; this module checks that its metadata and tensors make a model
and builds it.

Everything read from the file is checked before it is used: a hostile or
truncated file is a CheckpointError naming the file (and the tensor), never a
traceback or a silently wrong model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..model.linear import Linear
from ..model.llama import Llama, LlamaBlock, LlamaHParams, LlamaWeights
from ..model.qwen2 import Qwen2
from ..model.tokenizer import gguf_encoding
from .gguf_file import GGUFFile
from .safetensors import CheckpointError


@dataclass(frozen=True)
class Architecture:
    """A GGUF architecture specdec runs: its model class, and what its file holds beyond a Llama's tensors."""

    model: type  # llama.Llama or a subclass; the metadata keys are "<architecture>.context_length", ...
    permuted_qk: bool  # W_q's and W_k's rows in llama.cpp's order for its interleaved rotation (unpermute_rows)
    qkv_bias: bool  # blk.N.attn_q.bias, attn_k.bias, attn_v.bias


# general.architecture -> Architecture, one row each. llama.cpp's converter permutes W_q's and W_k's rows
# where llama.cpp rotates interleaved pairs (Llama); Qwen2 it rotates by halves, as Hugging Face does, and
# stores as Hugging Face does.
ARCHITECTURES = {
    "llama": Architecture(Llama, permuted_qk=True, qkv_bias=False),
    "qwen2": Architecture(Qwen2, permuted_qk=False, qkv_bias=True),
}

MAX_SIZE = 1 << 24  # any width, head count, vocabulary or context: far above any Llama's, keeps arithmetic small


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of W_q's (or W_k's) rows: [n_heads * d_head, n_in] -> the same, Hugging Face's order.

    Within each head, Hugging Face's Llama pairs dimension i with i + d_head/2 for
    the rotation; llama.cpp pairs 2i with 2i + 1, so its converter moved row
    i + half*(d_head/2) of a head to row 2i + half. Reading the head's rows as
    [d_head/2, 2] and swapping the axes puts them back.
    """
    n_out, n_in = w.shape
    d_head = n_out // n_heads
    return w.reshape(n_heads, d_head // 2, 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)


def load_gguf(path: str | Path, name: str | None = None, file: BinaryIO | None = None):
    """A specdec Llama (model/llama.py) or Qwen2 (model/qwen2.py) with its tokenizer, from a GGUF file of an
    architecture in ARCHITECTURES (file: `path` already open, see GGUFFile)."""
    f = GGUFFile(path, file)
    meta = f.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:  # (a list would not even be looked up)
        raise CheckpointError(
            f"{f.path}: architecture {arch!r}; specdec runs GGUF files of the "
            f"{' and '.join(map(repr, ARCHITECTURES))} architectures"
        )
    spec = ARCHITECTURES[arch]

    def whole(key: str, most: int = MAX_SIZE, why: str = "") -> int:
        """A size: a whole number from 1 to `most` (a float that is one is accepted, as llama.cpp does)."""
        value = meta.get(f"{arch}.{key}")
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not (ok and value == int(value) and 1 <= value <= most):
            raise CheckpointError(
                f"{f.path}: metadata {arch}.{key} is {value!r:.40}, not a whole number from 1 to "
                f"{most}{why}; the file is broken"
            )
        return int(value)

    def positive(key: str, default: float, high: float) -> float:
        """A constant in (0, high): NaN, infinity, zero and negatives are refused here, not met while decoding."""
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < high:  # NaN fails both
            raise CheckpointError(
                f"{f.path}: metadata {arch}.{key} is {value!r:.40}, not a number between 0 and "
                f"{high:g}; the file is broken"
            )
        return float(value)

    tokens = meta.get("tokenizer.ggml.tokens")
    # NOTE: the layer count is checked against the tensor table before a name is made for each layer:
    # a few bytes of metadata must not make the loader build millions of names.
    # The tensors of one block (blk.N.<name>): a file with fewer than n_layer of each cannot be n_layer deep.
    room = max(0, (len(f.tensors) - 2) // len(LlamaBlock.CHECKPOINT_NAMES))
    sizes = dict(
        n_vocab=len(tokens) if isinstance(tokens, list) else whole("vocab_size"),
        n_ctx=whole("context_length"),
        n_embd=whole("embedding_length"),
        n_head=whole("attention.head_count"),
        n_kv_head=whole("attention.head_count_kv"),
        n_layer=whole("block_count", room, f" (its tensor table has room for {room})"),
        n_ff=whole("feed_forward_length"),
        rope_theta=positive("rope.freq_base", 10000.0, 1e12),
        rms_eps=positive("attention.layer_norm_rms_epsilon", 1e-5, 1.0),
    )
    try:
        h = LlamaHParams(**sizes)
    except ValueError as e:  # heads that do not divide the width
        raise CheckpointError(f"{f.path}: {e}") from None
    # What model/llama.py does not implement is refused, not ignored: it would run, and be silently wrong.
    rope_dims = meta.get(f"{arch}.rope.dimension_count", h.d_head)
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if rope_dims != h.d_head:
        raise CheckpointError(
            f"{f.path}: {arch}.rope.dimension_count is {rope_dims!r}; specdec rotates all "
            f"{h.d_head} dimensions of a head (partial rotary embeddings are not implemented)"
        )
    if scaling != "none" or "rope_freqs.weight" in f.tensors:
        what = f"{arch}.rope.scaling.type is {scaling!r}" if scaling != "none" else "it has rope_freqs.weight"
        raise CheckpointError(
            f"{f.path}: {what} (scaled rotary frequencies: Llama 3's, YaRN); specdec "
            "implements plain rotary embeddings only"
        )
    kv = h.n_kv_head * h.d_head
    expected = {"token_embd.weight": (h.n_vocab, h.n_embd), "output_norm.weight": (h.n_embd,)}
    block = LlamaBlock.checkpoint_shapes(h)  # {name: shape} of one block's nine tensors
    for i in range(h.n_layer):
        p = f"blk.{i}."
        expected.update({f"{p}{name}.weight": shape for name, shape in block.items()})
        if spec.qkv_bias:
            expected.update({p + "attn_q.bias": (h.n_embd,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)})
    if "output.weight" in f.tensors:
        expected["output.weight"] = (h.n_vocab, h.n_embd)
    for key, shape in expected.items():
        if key not in f.tensors:
            raise CheckpointError(f"{f.path}: no tensor {key!r}; a {arch} GGUF with {h.n_layer} blocks needs it")
        if f.tensors[key].shape != shape:
            raise CheckpointError(
                f"{f.path}, tensor {key!r}: shape {f.tensors[key].shape}, expected {shape} from the file's own metadata"
            )
    extra = sorted(set(f.tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{f.path}: unexpected tensors {', '.join(extra[:4])}: not a plain {arch} model")

    def lin(key: str, heads: int | None = None) -> np.ndarray:
        w = f.tensor(key)  # [n_out, n_in]: already the transposed layout Linear keeps
        return unpermute_rows(w, heads) if heads and spec.permuted_qk else w

    blocks = []
    for i in range(h.n_layer):
        p = f"blk.{i}."
        blocks.append(
            LlamaBlock.fuse(
                attn_norm=f.tensor(p + "attn_norm.weight"),
                attn_q=lin(p + "attn_q.weight", h.n_head),
                attn_k=lin(p + "attn_k.weight", h.n_kv_head),
                attn_v=lin(p + "attn_v.weight"),
                attn_output=lin(p + "attn_output.weight"),
                ffn_norm=f.tensor(p + "ffn_norm.weight"),
                ffn_gate=lin(p + "ffn_gate.weight"),
                ffn_up=lin(p + "ffn_up.weight"),
                ffn_down=lin(p + "ffn_down.weight"),
                qkv_bias=tuple(f.tensor(p + f"attn_{x}.bias") for x in "qkv") if spec.qkv_bias else None,
            )
        )
    head = Linear(lin("output.weight"), None) if "output.weight" in f.tensors else None
    weights = LlamaWeights(f.tensor("token_embd.weight"), blocks, f.tensor("output_norm.weight"), head)
    tokenizer = gguf_encoding(meta, f.path) if isinstance(tokens, list) else None
    return spec.model(h, weights, tokenizer, name=name or f.path.stem)
