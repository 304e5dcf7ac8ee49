"""GPT-2 forward pass in NumPy, with an explicit KV cache.

This file is pure math: hyperparameters, weights as plain float32 arrays named as in
the checkpoint, and GPT-2's own part of the forward pass (embedding, block, final
LayerNorm). Every projection is written `x @ lin`: exactly x @ W + b (linear.py).
What every architecture shares lives beside it: attention, the tree mask and the KV
cache (attention.py), and the model class's plumbing, `forward` over a chain, a tree
or a ragged batch (base.py). Reading checkpoints from disk lives in
checkpoints/gpt2_folder.py; nothing here does I/O.

A block over a packed batch (`packed_block`): x holds the new tokens of every
sequence of the batch, one after the other (n_tok = the sum of their n_seq).
Everything but attention acts on each token alone, so each weight matrix is ONE
product over the whole batch: that is where decoding's time goes (reading the
weights), and why a batch is cheap. Attention mixes tokens, so it runs per
sequence, each against its own cache: no padding, no mask between sequences. A
block writes its layer's new keys and values into each row's cache at
[n_past, n_past + n_seq); forward advances cache.length once after all layers.

What it adds over a minimal NumPy GPT-2 (such as picoGPT): a KV cache that is
explicit data with O(1) rollback, a forward pass over *several* new tokens at
once against that cache (the batched verification pass of speculative decoding),
new tokens that form a *tree* rather than a chain (`parents`, `tree_mask`), with
the accepted path compacted back into place (`KVCache.keep`), a *ragged batch*
of sequences in one pass, each with its own cache and length (`forward_batch`:
one matrix product per weight for the whole batch, attention per sequence),
logits only for the rows a caller asks for, and float32 kept end to end.

Shape notation used in comments throughout:
    n_seq    tokens in the current forward call (the "new" tokens)
    n_past   tokens already in the KV cache before the call
    n_kv     n_past + n_seq, every position a new token may attend to
    n_embd   model width (768 for 124M)
    n_head   attention heads; d_head = n_embd // n_head (64 for every GPT-2)
    n_vocab  vocabulary size (50257)
    n_ctx    context window (1024)
    n_tok    in a batch, the new tokens of all its sequences together (the sum of their n_seq)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import KVCache, attention
from .base import LanguageModel, Row, weights_per_step
from .linear import Linear

F32 = np.float32

# NOTE: constants are float32 on purpose. Under NumPy 2, mixing a float32 array
# with a float64 *array* (or a NumPy float64 scalar such as np.sqrt(2.0))
# promotes the whole result to float64, silently halving speed.
_GELU_C = F32(np.sqrt(2.0 / np.pi))  # 0.7978846
_GELU_A = F32(0.044715)


@dataclass(frozen=True)
class HParams:
    """GPT-2 hyperparameters, as in the checkpoint's config.json."""

    n_vocab: int  # vocabulary size; config.json "vocab_size"
    n_ctx: int  # longest sequence the position embedding covers; "n_positions"
    n_embd: int  # width of the residual stream
    n_head: int  # attention heads per layer
    n_layer: int  # transformer blocks
    layer_norm_epsilon: float = 1e-5  # added to the variance in every LayerNorm

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        return self.n_head  # one key/value head per query head (KVCache reads this)

    def __post_init__(self):
        for field in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"hyperparameter {field} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


@dataclass
class Block:
    """One transformer block's weights; field names follow the checkpoint keys h.N.<name>."""

    ln_1_weight: np.ndarray  # [n_embd]
    ln_1_bias: np.ndarray  # [n_embd]
    attn_c_attn: Linear  # [n_embd] -> [3*n_embd]: fused q, k, v projection
    attn_c_proj: Linear  # [n_embd] -> [n_embd]
    ln_2_weight: np.ndarray  # [n_embd]
    ln_2_bias: np.ndarray  # [n_embd]
    mlp_c_fc: Linear  # [n_embd] -> [4*n_embd]
    mlp_c_proj: Linear  # [4*n_embd] -> [n_embd]


@dataclass
class Weights:
    """All of GPT-2's weights. The LM head is tied to wte: logits = x @ wte.T."""

    wte: np.ndarray  # [n_vocab, n_embd] token embedding (and output projection)
    wpe: np.ndarray  # [n_ctx, n_embd] learned position embedding
    blocks: list[Block]  # n_layer of them
    ln_f_weight: np.ndarray  # [n_embd]
    ln_f_bias: np.ndarray  # [n_embd]
    lm_head: Linear | None = None  # wte itself as a bias-free Linear: [n_embd] -> [n_vocab]

    def __post_init__(self):
        # wte is [n_vocab, n_embd], which is already the transposed layout
        # Linear wants for x @ wte.T: this wraps it without copying.
        if self.lm_head is None:
            self.lm_head = Linear(self.wte, None)


# ---------------------------------------------------------------------------
# The building blocks, smallest first.
# ---------------------------------------------------------------------------


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's tanh approximation of GELU ("gelu_new" in transformers):
    0.5 x (1 + tanh(C (x + A x^3))), computed in one buffer (the same roundings, in the same order)."""
    y = _GELU_A * x
    y *= x
    y *= x
    y += x
    y *= _GELU_C
    np.tanh(y, out=y)
    y += F32(1.0)
    y *= x
    y *= F32(0.5)  # exact: (1 + t) x / 2 rounds as 0.5 x (1 + t) does
    return y


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """Normalise each row to mean 0, variance 1, then scale and shift.  [n_seq, n_embd]"""
    n = F32(x.shape[-1])
    # (x.mean() would do the same, with more Python overhead per call.)
    y = x - x.sum(axis=-1, keepdims=True) / n  # centred: [n_seq, n_embd]
    var = np.square(y).sum(axis=-1, keepdims=True) / n  # [n_seq, 1]
    y /= np.sqrt(var + F32(eps))
    y *= g
    y += b
    return y


def transformer_block(
    x: np.ndarray, block: Block, hparams: HParams, cache: KVCache, layer: int, bias: np.ndarray | None
) -> np.ndarray:
    """One pre-LayerNorm block over one sequence's new tokens: `packed_block` of a single row.  [n_seq, n_embd]"""
    return packed_block(x, block, hparams, [Row(0, len(x), cache, cache.length, bias)], layer)


def packed_block(x: np.ndarray, block: Block, hparams: HParams, rows: list[Row], layer: int) -> np.ndarray:
    """One pre-LayerNorm block over a packed batch: x + attn(ln_1(x)), then x + mlp(ln_2(x)).  [n_tok, n_embd]
    Each product is one for the whole batch; attention runs per row, writing the row's new keys and values."""
    n_embd = x.shape[1]
    n_head, d_head = hparams.n_head, hparams.d_head
    eps = hparams.layer_norm_epsilon

    # Multi-head causal self-attention.
    h = layer_norm(x, block.ln_1_weight, block.ln_1_bias, eps)  # [n_tok, n_embd]
    qkv = h @ block.attn_c_attn  # [n_tok, 3*n_embd]: one product for the whole batch
    a = np.empty_like(x)  # [n_tok, n_embd]: every row's attention output, packed like x
    for row in rows:
        n_seq, n_kv = row.stop - row.start, row.n_past + row.stop - row.start
        # [n_seq, 3*n_embd] -> [3, n_head, n_seq, d_head]: split q/k/v, then heads.
        q, k_new, v_new = qkv[row.start : row.stop].reshape(n_seq, 3, n_head, d_head).transpose(1, 2, 0, 3)
        row.cache.k[layer, :, row.n_past : n_kv] = k_new
        row.cache.v[layer, :, row.n_past : n_kv] = v_new
        k = row.cache.k[layer, :, :n_kv]  # [n_head, n_kv, d_head]
        v = row.cache.v[layer, :, :n_kv]  # [n_head, n_kv, d_head]
        out = attention(q, k, v, row.bias)  # [n_head, n_seq, d_head]
        a[row.start : row.stop] = out.transpose(1, 0, 2).reshape(n_seq, n_embd)  # merge heads
    x = x + a @ block.attn_c_proj

    # Position-wise feed-forward network.
    h = layer_norm(x, block.ln_2_weight, block.ln_2_bias, eps)  # [n_tok, n_embd]
    h = gelu(h @ block.mlp_c_fc)  # [n_tok, 4*n_embd]
    return x + h @ block.mlp_c_proj  # [n_tok, n_embd]


class GPT2(LanguageModel):
    """GPT-2 ready to run (base.LanguageModel): what is GPT-2's own is the embedding
    (token + learned position), the block, the final LayerNorm and the weights a step reads."""

    def __init__(self, hparams: HParams, weights: Weights, tokenizer=None, name: str = "gpt2"):
        super().__init__(hparams, weights, tokenizer, name)

    def __repr__(self) -> str:
        h = self.hparams
        return (
            f"GPT2({self.name!r}, n_layer={h.n_layer}, n_embd={h.n_embd}, "
            f"n_head={h.n_head}, n_vocab={h.n_vocab}, n_ctx={h.n_ctx})"
        )

    def embed_and_run(
        self, flat: np.ndarray, positions: np.ndarray, rows: list[Row], n_layer: int, states: dict | None = None
    ) -> np.ndarray:
        """Token ids and positions -> [n_tok, n_embd] after the first n_layer blocks (states: base.embed_and_run)."""
        w = self.weights
        x = w.wte[flat] + w.wpe[positions]  # [n_tok, n_embd]: token plus learned position embedding
        for layer in range(n_layer):
            if states is not None and layer in states:
                states[layer] = x
            x = packed_block(x, w.blocks[layer], self.hparams, rows, layer)
        return x

    def final_norm(self, x: np.ndarray) -> np.ndarray:
        """ln_f.  [n_tok, n_embd]"""
        return layer_norm(x, self.weights.ln_f_weight, self.weights.ln_f_bias, self.hparams.layer_norm_epsilon)

    def block_weights(self) -> int:
        return block_weights(self.n_embd)

    def cast(self, convert) -> GPT2:
        w = self.weights
        blocks = [Block(**{name: convert(value) for name, value in vars(b).items()}) for b in w.blocks]
        weights = Weights(convert(w.wte), convert(w.wpe), blocks, convert(w.ln_f_weight), convert(w.ln_f_bias))
        return GPT2(self.hparams, weights, self.tokenizer, name=self.name)


def block_linear_weights(n_embd: int) -> int:
    """A GPT-2 block's matrix weights: c_attn 3 n_embd^2, c_proj n_embd^2, mlp_c_fc and mlp_c_proj 4 n_embd^2 each
    (checkpoints/registry.py sizes the transposed copy kept beside a checkpoint with it)."""
    return 12 * n_embd * n_embd


def block_weights(n_embd: int) -> int:
    """Weights one GPT-2 block reads per token: its four matrices, their biases (9 n_embd), two LayerNorms (4 n_embd)."""
    return block_linear_weights(n_embd) + 13 * n_embd


def step_weights(hparams: HParams, n_layer: int | None = None) -> int:
    """GPT2.step_weights from hyperparameters alone (bench/speed/ sizes models it has not built)."""
    n_layer = hparams.n_layer if n_layer is None else n_layer
    return weights_per_step(n_layer, block_weights(hparams.n_embd), hparams.n_vocab, hparams.n_embd)


def random_weights(hparams: HParams, seed: int = 0, scale: float = 0.02) -> Weights:
    """GPT-2-shaped random weights, for tests and benchmarks (no download).

    Linear weights and embeddings ~ N(0, scale^2); LayerNorm gains ~ 1 + small
    noise. A larger `scale` gives peakier, more interesting distributions.
    """
    rng = np.random.default_rng(seed)
    e = hparams.n_embd

    def normal(*shape, std=scale):
        return (rng.standard_normal(shape, dtype=F32) * F32(std)).astype(F32)

    def gain(n):
        return F32(1.0) + normal(n, std=0.1)

    def lin(n_in, n_out):
        return Linear.from_checkpoint(normal(n_in, n_out), normal(n_out, std=0.02))

    blocks = [
        Block(
            ln_1_weight=gain(e),
            ln_1_bias=normal(e, std=0.02),
            attn_c_attn=lin(e, 3 * e),
            attn_c_proj=lin(e, e),
            ln_2_weight=gain(e),
            ln_2_bias=normal(e, std=0.02),
            mlp_c_fc=lin(e, 4 * e),
            mlp_c_proj=lin(4 * e, e),
        )
        for _ in range(hparams.n_layer)
    ]
    return Weights(
        wte=normal(hparams.n_vocab, e),
        wpe=normal(hparams.n_ctx, e),
        blocks=blocks,
        ln_f_weight=gain(e),
        ln_f_bias=normal(e, std=0.02),
    )
