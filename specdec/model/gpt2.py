"""GPT-2 forward pass in NumPy, with an explicit KV cache.

This file is pure math: hyperparameters, weights as plain float32 arrays named as in
the checkpoint, the KV cache, and the forward pass. Reading checkpoints from disk
lives in checkpoints/load.py; nothing here does I/O.

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

from .cache import KVCache
from .kernels import Linear, linear, pass_threads
from .packing import PREFILL_CHUNK, Row, in_chunks, lm_head_rows, pack, tree_mask  # noqa: F401 (tree_mask: gpt2.tree_mask, as before)

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


def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis, shifted by the max for stability, in one buffer
    (out=x: in place, which attention does with its scores, the largest arrays of a long prompt)."""
    out = np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    return out


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


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Masked attention of n_seq new queries over n_kv = n_past + n_seq positions.

    q: [n_head, n_seq, d_head]; k, v: [n_head, n_kv, d_head] -> [n_head, n_seq, d_head]
    bias: [n_seq, n_kv], 0 where query i may attend to key j and -inf where not
    (None for a single new token, which may attend to everything).

    NOTE: in a chain, new token i sits at position n_past + i and may attend to
    every cached position and to new tokens 0..i, never to new tokens after it.
    This mask is what makes one forward over [last token, d_0 .. d_(K-1)] give,
    in row i, the same logits as feeding those tokens one at a time. A tree
    replaces the new-token part with `tree_mask` (see `forward`).
    """
    d_head = q.shape[2]
    scores = (q * F32(1.0 / np.sqrt(d_head))) @ k.transpose(0, 2, 1)  # [n_head, n_seq, n_kv]
    if bias is not None:
        scores += bias  # broadcast over heads
    return softmax(scores, out=scores) @ v  # [n_head, n_seq, n_kv] @ [n_head, n_kv, d_head]


def transformer_block(
    x: np.ndarray, block: Block, hparams: HParams, cache: KVCache, layer: int, bias: np.ndarray | None
) -> np.ndarray:
    """One pre-LayerNorm block over one sequence's new tokens: `packed_block` of a single row.  [n_seq, n_embd]"""
    return packed_block(x, block, hparams, [Row(0, len(x), cache, cache.length, bias)], layer)


def packed_block(x: np.ndarray, block: Block, hparams: HParams, rows: list[Row], layer: int) -> np.ndarray:
    """One pre-LayerNorm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)), over a packed batch.  [n_tok, n_embd]

    x holds the new tokens of every sequence of the batch, one after the other
    (n_tok = the sum of their n_seq). Everything but attention acts on each
    token alone, so each weight matrix is ONE product over the whole batch:
    that is where decoding's time goes (reading the weights), and why a batch
    is cheap. Attention mixes tokens, so it runs per sequence, each against its
    own cache: no padding, no mask between sequences.

    Writes this layer's new keys and values into each row's cache at
    [n_past, n_past + n_seq); the caller advances cache.length once after all layers.
    """
    n_embd = x.shape[1]
    n_head, d_head = hparams.n_head, hparams.d_head
    eps = hparams.layer_norm_epsilon

    # Multi-head causal self-attention.
    h = layer_norm(x, block.ln_1_weight, block.ln_1_bias, eps)  # [n_tok, n_embd]
    qkv = linear(h, block.attn_c_attn)  # [n_tok, 3*n_embd]: one product for the whole batch
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
    x = x + linear(a, block.attn_c_proj)

    # Position-wise feed-forward network.
    h = layer_norm(x, block.ln_2_weight, block.ln_2_bias, eps)  # [n_tok, n_embd]
    h = gelu(linear(h, block.mlp_c_fc))  # [n_tok, 4*n_embd]
    return x + linear(h, block.mlp_c_proj)  # [n_tok, n_embd]


def forward(
    weights: Weights,
    hparams: HParams,
    tokens: np.ndarray,
    cache: KVCache,
    last_only: bool = False,
    n_layer: int | None = None,
    return_hidden: bool = False,
    parents=None,
):
    """Run n_seq new tokens through GPT-2 after the cache's n_past tokens: `forward_batch` of one row.

    tokens: [n_seq] int.  Returns float32 logits, [n_seq, n_vocab], or [1, n_vocab]
    for the last new token only when `last_only` (the LM head is the largest
    matrix in the model, so skipping rows nobody reads matters).

    `n_layer` runs only the first n_layer blocks before ln_f and the LM head: the
    early-exit draft of self-speculative decoding. It writes keys/values for
    those layers only, so its caller must roll the cache back before a full pass.

    `parents` ([n_seq] ints, see `tree_mask`) makes the new tokens a tree: node i
    attends to the cache, its ancestors and itself, and sits at position
    n_past + depth(i). None is a chain, parents = [-1, 0, 1, ...]. The cache then
    holds one entry per node in this flat order; `KVCache.keep` compacts the
    accepted path afterwards.

    `return_hidden` returns (logits, hidden) instead, hidden [n_seq, n_embd] being
    the final hidden state after ln_f (what the LM head reads; what learned draft
    heads read), for every new token even when `last_only` trims the logits.
    """
    if parents is None and len(tokens) > PREFILL_CHUNK:  # a long prompt: in passes of PREFILL_CHUNK tokens
        def run(part):  # one chunk, after the cache the chunks before it filled
            return forward(weights, hparams, part, cache, last_only, n_layer, return_hidden)

        return in_chunks(run, tokens, cache, last_only, return_hidden, PREFILL_CHUNK)
    out = forward_batch(weights, hparams, [tokens], [cache], last_only, n_layer, return_hidden, [parents])
    return (out[0][0], out[1][0]) if return_hidden else out[0]


def forward_batch(
    weights: Weights,
    hparams: HParams,
    tokens: list,
    caches: list[KVCache],
    last_only: bool = False,
    n_layer: int | None = None,
    return_hidden: bool = False,
    parents: list | None = None,
):
    """A ragged batch: row b's new tokens tokens[b] ([n_seq_b] ints) after caches[b]'s n_past_b tokens.

    Each row brings its own tokens, its own KV cache and its own cache length,
    so rows may differ in both (after a round of speculative decoding they do:
    each row accepted a different number of drafts). The rows' new tokens are
    packed into one [n_tok, n_embd] matrix, n_tok = sum of n_seq_b, so every
    weight matrix is read once for the whole batch (`packed_block`); attention
    runs per row against the row's own cache. Rolling back stays per row:
    caches[b].rollback(n).

    Returns a list with one [n_seq_b, n_vocab] logits array per row ([1, n_vocab]
    with `last_only`), or (logits list, hidden list) with `return_hidden`.
    `n_layer`, `parents` (one entry per row, None for a chain) and the rest: as
    in `forward`, which is this function for a batch of one.
    """
    n_layer = hparams.n_layer if n_layer is None else n_layer
    if not 1 <= n_layer <= hparams.n_layer:
        raise ValueError(f"n_layer must be in 1..{hparams.n_layer}, got {n_layer}")
    flat, positions, rows = pack(hparams, tokens, caches, parents)

    x = weights.wte[flat] + weights.wpe[positions]  # [n_tok, n_embd]
    with pass_threads(len(flat)):  # OpenBLAS on one thread for a few tokens (kernels.pass_threads)
        for layer in range(n_layer):
            x = packed_block(x, weights.blocks[layer], hparams, rows, layer)
        for row in rows:
            row.cache.length = row.n_past + row.stop - row.start
        return lm_head_rows(x, rows, last_only, return_hidden, lambda h: layer_norm(
            h, weights.ln_f_weight, weights.ln_f_bias, hparams.layer_norm_epsilon), weights.lm_head)  # fmt: skip


class GPT2:
    """A GPT-2 ready to run: hyperparameters, weights and (optionally) its tokenizer.

    `model(tokens)` is the cache-free convenience call: logits for every
    position of a fresh sequence. Decoders use `new_cache()` and `forward()`.
    """

    def __init__(self, hparams: HParams, weights: Weights, tokenizer=None, name: str = "gpt2"):
        self.hparams = hparams
        self.weights = weights
        self.tokenizer = tokenizer  # a tiktoken.Encoding, or None for tokenizer-less test models
        self.name = name

    def __repr__(self) -> str:
        h = self.hparams
        return (
            f"GPT2({self.name!r}, n_layer={h.n_layer}, n_embd={h.n_embd}, "
            f"n_head={h.n_head}, n_vocab={h.n_vocab}, n_ctx={h.n_ctx})"
        )

    # Hyperparameters read like attributes of the model: model.n_vocab, ...
    n_vocab = property(lambda self: self.hparams.n_vocab)
    n_ctx = property(lambda self: self.hparams.n_ctx)
    n_embd = property(lambda self: self.hparams.n_embd)
    n_head = property(lambda self: self.hparams.n_head)
    n_layer = property(lambda self: self.hparams.n_layer)

    @property
    def dtype(self) -> np.dtype:
        return self.weights.wte.dtype  # float32, or float64 after astype(np.float64)

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(self.hparams, capacity, dtype=self.dtype)

    def astype(self, dtype) -> "GPT2":
        """This model with every weight converted to `dtype` (np.float32 or np.float64): a copy.

        float64 is the exact-greedy option. In float32, a (K+1)-token verification
        pass and a 1-token step add the same numbers in different orders, so
        their logits differ by about 1e-6 relative, and where the two best tokens
        lie that close, greedy speculative decoding can pick differently from
        greedy autoregressive decoding. In float64 the two agree wherever the top
        two logits differ by more than about 1e-13, so in practice always.
        It costs twice the memory and, decoding being memory-bound, about twice
        the time per step (README, "Performance"). The draft can stay float32.
        """
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"a GPT2 computes in float32 or float64, not {dtype}")

        def cast(value):
            if isinstance(value, Linear):
                return Linear(value.w_t.astype(dtype), None if value.b is None else value.b.astype(dtype))
            return value.astype(dtype)

        w = self.weights
        blocks = [Block(**{name: cast(value) for name, value in vars(b).items()}) for b in w.blocks]
        weights = Weights(cast(w.wte), cast(w.wpe), blocks, cast(w.ln_f_weight), cast(w.ln_f_bias))
        return GPT2(self.hparams, weights, self.tokenizer, name=self.name)

    def forward(
        self,
        tokens,
        cache: KVCache,
        last_only: bool = False,
        n_layer: int | None = None,
        return_hidden: bool = False,
        parents=None,
    ):
        """See `forward` above: appends `tokens` (a chain, or a tree given `parents`) to `cache`;
        returns logits, or (logits, hidden after ln_f) with `return_hidden`."""
        return forward(self.weights, self.hparams, tokens, cache, last_only, n_layer, return_hidden, parents)

    def forward_batch(self, tokens: list, caches: list[KVCache], last_only: bool = False,
                      n_layer: int | None = None, return_hidden: bool = False, parents: list | None = None):  # fmt: skip
        """See `forward_batch` above: row b's `tokens[b]` appended to `caches[b]`; a list of logits per row."""
        return forward_batch(self.weights, self.hparams, tokens, caches, last_only, n_layer, return_hidden, parents)

    def __call__(self, tokens) -> np.ndarray:
        """[n_seq] token ids -> [n_seq, n_vocab] float32 logits, no cache kept."""
        tokens = np.asarray(tokens)
        if not 1 <= len(tokens) <= self.n_ctx:
            raise ValueError(f"need 1..{self.n_ctx} tokens, got {len(tokens)}")
        return self.forward(tokens, self.new_cache(len(tokens)))


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
