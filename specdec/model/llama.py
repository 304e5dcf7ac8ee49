"""A Llama-architecture forward pass in NumPy (SmolLM2, and the models built like it), with the same KV cache.

Read it next to gpt2.py: both are a base.LanguageModel (forward over a chain or
a tree of new tokens against a KVCache, early exit, hidden states, float64), so
every sampler and drafter in specdec runs on either; this file holds only what is
Llama's own (embedding, block, final norm, the weights a step reads). What changed between
GPT-2's block (2019) and Llama's (Touvron et al., arXiv 2302.13971), which
nearly every model since is built from:

    GPT-2                               Llama
    LayerNorm (mean, variance, bias)    RMSNorm: scale by 1/rms, no mean, no bias (Zhang & Sennrich, 1910.07467)
    learned position embedding wpe      rotary embedding of q and k (RoPE; Su et al., arXiv 2104.09864)
    n_head key/value heads              n_kv_head < n_head: grouped-query attention (Ainslie et al., 2305.13245)
    MLP: gelu(x W1) W2, 4x wide         SwiGLU: (silu(x W_gate) * (x W_up)) W_down (Shazeer, 2002.05202)
    biases everywhere                   no biases
    LM head = wte (tied)                tied in SmolLM2 too; other Llamas ship an output matrix

Shape notation as in gpt2.py, plus:
    n_kv_head  key/value heads; query head h reads key/value head h // (n_head // n_kv_head)
    n_ff       the SwiGLU hidden width (1536 for SmolLM2-135M)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .attention import attention
from .base import LanguageModel, Row
from .linear import Linear

F32 = np.float32


@dataclass(frozen=True)
class LlamaHParams:
    """Llama hyperparameters, as a GGUF's `llama.*` metadata gives them."""

    n_vocab: int
    n_ctx: int  # llama.context_length
    n_embd: int  # llama.embedding_length
    n_head: int  # llama.attention.head_count
    n_kv_head: int  # llama.attention.head_count_kv
    n_layer: int  # llama.block_count
    n_ff: int  # llama.feed_forward_length
    rope_theta: float = 10000.0  # llama.rope.freq_base
    rms_eps: float = 1e-5  # llama.attention.layer_norm_rms_epsilon

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head

    @property
    def layer_norm_epsilon(self) -> float:
        return self.rms_eps  # the name draft heads read (eagle.py builds its own small block with it)

    def __post_init__(self):
        for field in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_kv_head", "n_layer", "n_ff"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"hyperparameter {field} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head or self.d_head % 2:
            raise ValueError(
                f"n_embd ({self.n_embd}) must split into n_head ({self.n_head}) heads of even width, and n_head "
                f"into groups of n_kv_head ({self.n_kv_head})"
            )


class FusedRows:
    """A checkpoint's matrix kept as rows of a fused one (LlamaBlock.attn_q, say, inside attn_qkv).

    Reading it gives a Linear over a view of those rows (no copy); assigning a
    Linear of the same shape writes its weights into those rows, so the fused
    matrix the forward pass multiplies by is the one changed.
    """

    def __init__(self, fused: str, index: int):
        self.fused, self.index = fused, index  # the fused field, and which of its parts this is

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def rows(self, block, array: str = "w_t") -> np.ndarray | None:
        fused = getattr(getattr(block, self.fused), array)  # w_t [n_out of all parts, n_in], or b [n_out] or None
        edges = block.part_edges(self.fused)
        return None if fused is None else fused[edges[self.index] : edges[self.index + 1]]  # a view

    def __get__(self, block, owner=None):
        return self if block is None else Linear(self.rows(block), self.rows(block, "b"))

    def __set__(self, block, value: Linear) -> None:
        rows = self.rows(block)
        if value.w_t.shape != rows.shape:
            raise ValueError(f"{self.name} is {rows.shape[0]} x {rows.shape[1]}; got {value.w_t.shape}")
        rows[...] = value.w_t


@dataclass
class LlamaBlock:
    """One block's weights; names follow the GGUF tensors blk.N.<name>. Every matrix is a bias-free Linear,
    except that attn_qkv carries q's, k's and v's biases in a Qwen2 (qwen2.py).

    Two groups of the checkpoint's matrices read the same input, so they are
    stacked by rows at load time (`LlamaBlock.fuse`) and multiplied as one:
    q, k and v as attn_qkv, gate and up as ffn_gate_up. A block then makes 4
    products instead of 7, each reading its weights once, as GPT-2's fused
    c_attn does. The checkpoint's own matrices remain readable by their names
    (block.attn_q, ...: views of the fused rows, see FusedRows).
    """

    attn_norm: np.ndarray  # [n_embd]
    attn_qkv: Linear  # [n_embd] -> [(n_head + 2 * n_kv_head) * d_head]: q, then k, then v
    attn_output: Linear  # [n_embd] -> [n_embd]
    ffn_norm: np.ndarray  # [n_embd]
    ffn_gate_up: Linear  # [n_embd] -> [2 * n_ff]: gate, then up
    ffn_down: Linear  # [n_ff] -> [n_embd]

    attn_q = FusedRows("attn_qkv", 0)  # [n_embd] -> [n_head * d_head]
    attn_k = FusedRows("attn_qkv", 1)  # [n_embd] -> [n_kv_head * d_head]
    attn_v = FusedRows("attn_qkv", 2)  # [n_embd] -> [n_kv_head * d_head]
    ffn_gate = FusedRows("ffn_gate_up", 0)  # [n_embd] -> [n_ff]
    ffn_up = FusedRows("ffn_gate_up", 1)  # [n_embd] -> [n_ff]

    CHECKPOINT_NAMES = (
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    )

    @classmethod
    def fuse(
        cls,
        attn_norm,
        attn_q,
        attn_k,
        attn_v,
        attn_output,
        ffn_norm,
        ffn_gate,
        ffn_up,
        ffn_down,
        qkv_bias: tuple | None = None,
    ) -> LlamaBlock:
        """A block from the checkpoint's tensors: norms [n_embd], matrices as stored, [n_out, n_in];
        qkv_bias: (b_q, b_k, b_v) where q, k and v have biases (qwen2.py), stacked like their matrices."""
        b_qkv = None if qkv_bias is None else np.concatenate(qkv_bias)  # [(n_head + 2 * n_kv_head) * d_head]
        return cls(
            attn_norm,
            Linear(np.concatenate([attn_q, attn_k, attn_v]), b_qkv),
            Linear(attn_output, None),
            ffn_norm,
            Linear(np.concatenate([ffn_gate, ffn_up]), None),
            Linear(ffn_down, None),
        )

    def part_edges(self, fused: str) -> tuple[int, ...]:
        """Where each part of a fused matrix starts and stops, in its rows."""
        if fused == "attn_qkv":
            n_q = self.attn_output.w_t.shape[1]  # attn_output reads [n_head * d_head]
            n_kv = (self.attn_qkv.w_t.shape[0] - n_q) // 2
            return 0, n_q, n_q + n_kv, n_q + 2 * n_kv
        n_ff = self.ffn_gate_up.w_t.shape[0] // 2
        return 0, n_ff, 2 * n_ff

    @staticmethod
    def checkpoint_shapes(h: LlamaHParams) -> dict[str, tuple[int, ...]]:
        """{GGUF name: shape} of one block's nine tensors, matrices as stored ([n_out, n_in])."""
        e, dq, dkv = h.n_embd, h.n_head * h.d_head, h.n_kv_head * h.d_head
        return {
            "attn_norm": (e,),
            "attn_q": (dq, e),
            "attn_k": (dkv, e),
            "attn_v": (dkv, e),
            "attn_output": (e, dq),
            "ffn_norm": (e,),
            "ffn_gate": (h.n_ff, e),
            "ffn_up": (h.n_ff, e),
            "ffn_down": (e, h.n_ff),
        }

    def checkpoint_tensors(self) -> dict:
        """{GGUF name: the norm's array or the matrix's Linear}, the checkpoint's nine (views, no copies)."""
        return {name: getattr(self, name) for name in self.CHECKPOINT_NAMES}


@dataclass
class LlamaWeights:
    wte: np.ndarray  # [n_vocab, n_embd] token embedding ("token_embd")
    blocks: list[LlamaBlock]
    norm_f: np.ndarray  # [n_embd] the final RMSNorm ("output_norm")
    lm_head: Linear | None = None  # "output", or wte itself when tied (no copy)

    def __post_init__(self):
        if self.lm_head is None:
            self.lm_head = Linear(self.wte, None)


# ---------------------------------------------------------------------------
# The building blocks, smallest first.
# ---------------------------------------------------------------------------


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * g, per row: no mean subtracted, no bias.  [n_seq, n_embd]"""
    ms = np.square(x).sum(axis=-1, keepdims=True) / F32(x.shape[-1])  # [n_seq, 1]
    return x / np.sqrt(ms + F32(eps)) * g


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), the gate of SwiGLU."""
    with np.errstate(over="ignore"):  # e^-x is inf below x = -88 in float32: x / inf = -0, the right limit
        return x / (F32(1.0) + np.exp(-x))


def rope_tables(positions: np.ndarray, d_head: int, theta: float, dtype=F32) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each position's rotation angles: [n_seq] -> two [n_seq, d_head].

    Pair i of a head (dimensions i and i + d_head/2, as Hugging Face's Llama
    pairs them) turns by position * theta^(-2i / d_head): fast-turning pairs
    see nearby tokens, slow ones far-away tokens, and the dot product of a
    rotated query and key depends only on their distance.
    """
    inv_freq = (F32(1.0) / F32(theta) ** (np.arange(0, d_head, 2, dtype=F32) / F32(d_head))).astype(dtype)  # [d/2]
    angles = positions.astype(dtype)[:, None] * inv_freq[None, :]  # [n_seq, d_head/2]
    angles = np.concatenate([angles, angles], axis=1)  # [n_seq, d_head]: both halves of a pair turn alike
    return np.cos(angles), np.sin(angles)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Apply the rotation to q or k: [heads, n_seq, d_head], each pair (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).

    NOTE: this pairs dimension i with i + d_head/2 ("rotate half"). llama.cpp pairs
    2i with 2i + 1, and its GGUF converter permutes the rows of W_q and W_k to
    match; checkpoints/gguf.py (load_gguf) undoes that permutation when loading.
    """
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # rotate_half(x)
    return x * cos + rotated * sin


def grouped_attention(q, k, v, bias, n_kv_head: int) -> np.ndarray:
    """Grouped-query attention with attention.attention: q [n_head, n_seq, d], k, v [n_kv_head, n_kv, d] -> [n_head, n_seq, d].

    The n_head // n_kv_head query heads of a group share one key/value head, so
    they are stacked as extra query rows of that head: [n_kv_head, group * n_seq, d].
    """
    n_head, n_seq, d_head = q.shape
    group = n_head // n_kv_head
    q = q.reshape(n_kv_head, group * n_seq, d_head)  # query head h = kv head h // group
    bias = None if bias is None else np.tile(bias, (group, 1))  # [group * n_seq, n_kv]
    return attention(q, k, v, bias).reshape(n_head, n_seq, d_head)


def llama_block(x, block: LlamaBlock, h: LlamaHParams, rows: list[Row], layer: int, cos, sin) -> np.ndarray:
    """x + attn(rms_norm(x)), then x + swiglu(rms_norm(x)), over a packed batch (gpt2.packed_block).  [n_tok, n_embd]

    Every projection is one product over all rows' new tokens; attention runs per
    row against the row's own cache. cos, sin: [n_tok, d_head], each token's own
    position's rotation. Writes this layer's k, v into each row's cache.
    """
    n_tok, dq, dkv = x.shape[0], h.n_head * h.d_head, h.n_kv_head * h.d_head  # widths of q and of k, v
    a = rms_norm(x, block.attn_norm, h.rms_eps)  # [n_tok, n_embd]
    qkv = a @ block.attn_qkv  # [n_tok, dq + 2 * dkv]: q, k, v in one product
    # q's and k's heads side by side, each token turned by its own position's angles, in one call.
    # NOTE: keys are cached AFTER rotation, so a cached key carries its position for good.
    qk = qkv[:, : dq + dkv].reshape(n_tok, h.n_head + h.n_kv_head, h.d_head).transpose(1, 0, 2)
    qk = rotate(qk, cos, sin)  # [n_head + n_kv_head, n_tok, d]
    q, k = qk[: h.n_head], qk[h.n_head :]  # [n_head, n_tok, d], [n_kv_head, n_tok, d]
    v = qkv[:, dq + dkv :].reshape(n_tok, h.n_kv_head, h.d_head).transpose(1, 0, 2)  # [n_kv_head, n_tok, d]
    out = np.empty_like(x)  # [n_tok, n_embd]: every row's attention output, packed like x
    for row in rows:
        s, n_seq = slice(row.start, row.stop), row.stop - row.start
        n_kv = row.n_past + n_seq
        row.cache.k[layer, :, row.n_past : n_kv] = k[:, s]
        row.cache.v[layer, :, row.n_past : n_kv] = v[:, s]
        o = grouped_attention(
            q[:, s], row.cache.k[layer, :, :n_kv], row.cache.v[layer, :, :n_kv], row.bias, h.n_kv_head
        )
        out[s] = o.transpose(1, 0, 2).reshape(n_seq, h.n_embd)  # [n_head, n_seq, d] -> [n_seq, n_embd]
    x = x + out @ block.attn_output

    f = rms_norm(x, block.ffn_norm, h.rms_eps)  # [n_tok, n_embd]
    gate_up = f @ block.ffn_gate_up  # [n_tok, 2 * n_ff]: gate and up in one product
    gated = silu(gate_up[:, : h.n_ff]) * gate_up[:, h.n_ff :]  # [n_tok, n_ff]
    return x + gated @ block.ffn_down  # [n_tok, n_embd]


class Llama(LanguageModel):
    """A Llama ready to run (base.LanguageModel): what is Llama's own is the embedding (tokens only: positions
    enter by rotating q and k in every block), the block, the final RMSNorm and the weights a step reads."""

    def __init__(self, hparams: LlamaHParams, weights: LlamaWeights, tokenizer=None, name: str = "llama"):
        super().__init__(hparams, weights, tokenizer, name)  # tokenizer: tokenizer.gguf_encoding, or None

    def __repr__(self) -> str:
        h = self.hparams
        return (
            f"{type(self).__name__}({self.name!r}, n_layer={h.n_layer}, n_embd={h.n_embd}, n_head={h.n_head}, "
            f"n_kv_head={h.n_kv_head}, n_vocab={h.n_vocab}, n_ctx={h.n_ctx})"
        )

    def embed_and_run(
        self, flat: np.ndarray, positions: np.ndarray, rows: list[Row], n_layer: int, states: dict | None = None
    ) -> np.ndarray:
        """Token ids and positions -> [n_tok, n_embd] after the first n_layer blocks (states: base.embed_and_run)."""
        w, h = self.weights, self.hparams
        dtype = w.wte.dtype
        rows = [row if row.bias is None else replace(row, bias=row.bias.astype(dtype)) for row in rows]
        cos, sin = rope_tables(positions, h.d_head, h.rope_theta, dtype)  # [n_tok, d_head] each
        x = w.wte[flat]  # [n_tok, n_embd]: no position embedding
        for layer in range(n_layer):
            if states is not None and layer in states:
                states[layer] = x
            x = llama_block(x, w.blocks[layer], h, rows, layer, cos, sin)
        return x

    def final_norm(self, x: np.ndarray) -> np.ndarray:
        """output_norm.  [n_tok, n_embd]"""
        return rms_norm(x, self.weights.norm_f, self.hparams.rms_eps)

    def block_weights(self) -> int:
        """One block's matrices: q and output n_embd^2 each, k and v n_embd * n_kv_head * d_head each,
        gate, up and down n_embd * n_ff each (the two RMSNorm gains, 2 n_embd, left out as a rounding error)."""
        h = self.hparams
        return h.n_embd * (2 * h.n_embd + 2 * h.n_kv_head * h.d_head) + 3 * h.n_embd * h.n_ff

    def cast(self, convert) -> Llama:
        w = self.weights
        blocks = [LlamaBlock(**{name: convert(value) for name, value in vars(b).items()}) for b in w.blocks]
        tied = w.lm_head.w_t is w.wte
        weights = LlamaWeights(convert(w.wte), blocks, convert(w.norm_f), None if tied else convert(w.lm_head))
        return Llama(self.hparams, weights, self.tokenizer, name=self.name)


def random_llama(hparams: LlamaHParams | None = None, seed: int = 0, scale: float = 0.02) -> Llama:
    """A Llama with random weights (tests and benchmarks): by default a tiny one with grouped-query attention."""
    h = hparams or LlamaHParams(n_vocab=64, n_ctx=64, n_embd=32, n_head=4, n_kv_head=2, n_layer=2, n_ff=48)
    rng = np.random.default_rng(seed)

    def normal(*shape, std=scale):
        return (rng.standard_normal(shape, dtype=F32) * F32(std)).astype(F32)

    def lin(n_in, n_out):
        return normal(n_out, n_in)  # [n_out, n_in], as GGUF stores it

    kv = h.n_kv_head * h.d_head
    blocks = [
        LlamaBlock.fuse(
            F32(1) + normal(h.n_embd, std=0.1),
            lin(h.n_embd, h.n_embd),
            lin(h.n_embd, kv),
            lin(h.n_embd, kv),
            lin(h.n_embd, h.n_embd),
            F32(1) + normal(h.n_embd, std=0.1),
            lin(h.n_embd, h.n_ff),
            lin(h.n_embd, h.n_ff),
            lin(h.n_ff, h.n_embd),
        )
        for _ in range(h.n_layer)
    ]
    return Llama(
        h, LlamaWeights(normal(h.n_vocab, h.n_embd), blocks, F32(1) + normal(h.n_embd, std=0.1)), name="random-llama"
    )
