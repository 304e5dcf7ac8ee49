"""GPT-2 forward pass in NumPy, with an explicit KV cache.

This file is pure math: hyperparameters, weights as plain float32 arrays named as in
the checkpoint, the KV cache, and the forward pass. Reading checkpoints from disk
lives in checkpoint.py; nothing here does I/O.

What it adds over a minimal NumPy GPT-2 (such as picoGPT): a KV cache that is
explicit data with O(1) rollback, a forward pass over *several* new tokens at
once against that cache (the batched verification pass of speculative decoding),
new tokens that form a *tree* rather than a chain (`parents`, `tree_mask`), with
the accepted path compacted back into place (`KVCache.keep`), logits only for
the rows a caller asks for, and float32 kept end to end.

Shape notation used in comments throughout:
    n_seq    tokens in the current forward call (the "new" tokens)
    n_past   tokens already in the KV cache before the call
    n_kv     n_past + n_seq, every position a new token may attend to
    n_embd   model width (768 for 124M)
    n_head   attention heads; d_head = n_embd // n_head (64 for every GPT-2)
    n_vocab  vocabulary size (50257)
    n_ctx    context window (1024)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import threads

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

    def __post_init__(self):
        for field in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"hyperparameter {field} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


# The kernel's constants, all measured on GPT-2 shapes (README, "Performance"):
# Rows of a transposed weight matrix handled per gemv in a multi-token linear():
# about 256 KB, so one chunk stays in its core's L2 cache (1 MB here) while every
# token uses it (measured best of 64 KB..1.5 MB on an idle machine).
CHUNK_BYTES = 1 << 18
# Below this a matrix sits in cache anyway, and handing its parts to the workers costs more than
# splitting saves: plain x @ W. It is GPT-2 124M's smallest matrix (768 x 768 floats), which is
# split; every matrix of the shipped stdlib family is smaller (its step: 2.1 ms split, 0.32 ms not).
SMALL_BYTES = 768 * 768 * 4
MAX_CHUNKED_ROWS = 16  # measured crossover: above ~16 tokens, plain x @ W (OpenBLAS's own threads) wins
# Parts each weight matrix's rows are split into, one per core, multiplied on
# specdec's own threads (threads.py); 1 = no split, OpenBLAS threads every product.
SPLIT_PARTS = threads.default_workers()
SPLIT_ONE_TOKEN = True  # split 1-token products too (False: OpenBLAS's own threads for them)
# Where OpenBLAS has small-matrix GEMM kernels (threads.SMALL_GEMM_CORES), a few tokens go through
# a stack of [rows, n_in] x [n_in, n_seq] products small enough for them: rows * n_in * n_seq at
# most SMALL_GEMM_MNK, OpenBLAS's own limit for them. Each weight is then read once into registers
# and used for every token, instead of once per token from L2 cache.
SMALL_GEMM = threads.small_gemm_kernels()
SMALL_GEMM_MNK = 1_000_000
SMALL_GEMM_ROWS = 64  # rows per small product, at most (measured: 32..640)


TRANSPOSE_ROWS = 16  # input rows per step of transposed_copy (measured best of 4..64 and 2-D tiles)


def split_edges(n: int, n_parts: int, multiple: int = 16) -> list[int]:
    """Boundaries cutting range(n) into n_parts near-equal parts, the inner ones on multiples of `multiple`.

        split_edges(100, 2)   # [0, 48, 100]
    """
    return [0, *(round(n * i / n_parts / multiple) * multiple for i in range(1, n_parts)), n]


def transposed_copy(w: np.ndarray) -> np.ndarray:
    """W [n_in, n_out] -> a new C-contiguous float32 W.T [n_out, n_in], 16 rows of W at a time, on every core.

    np.ascontiguousarray(w.T) walks W with a stride of n_out floats and runs at
    about 0.5 GB/s. Copying a band of 16 whole rows of W at a time reads W
    sequentially and writes 64-byte runs of each output row, which keeps both
    sides in cache: 4-5 GB/s on one core, the bulk of `load_model`'s time
    otherwise. NumPy releases the GIL while it copies, so specdec's workers
    (threads.py) each take a share of the bands: 8-9 GB/s on two cores.
    """
    w = np.asarray(w)  # a plain view: slicing an np.memmap costs a Python object per slice
    n_in, n_out = w.shape
    w_t = np.empty((n_out, n_in), dtype=F32)

    def copy_bands(start: int, stop: int) -> None:
        for i in range(start, stop, TRANSPOSE_ROWS):
            w_t[:, i : i + TRANSPOSE_ROWS] = w[i : i + TRANSPOSE_ROWS].T  # [16, n_out] -> [n_out, 16]

    n_parts = max(1, min(SPLIT_PARTS, n_in // TRANSPOSE_ROWS))
    edges = split_edges(n_in, n_parts, TRANSPOSE_ROWS)
    threads.workers(n_parts).run([lambda a=a, b=b: copy_bands(a, b) for a, b in zip(edges, edges[1:])], blas=False)
    return w_t


@dataclass(frozen=True)
class RowPart:
    """Rows [start, stop) of a transposed weight, also viewed as a stack of L2-sized chunks."""

    start: int
    stop: int
    w_t: np.ndarray  # [stop - start, n_in], a view
    chunks: np.ndarray  # [n_chunks, 1, chunk, n_in]: a view of the first n_chunks * chunk rows

    @classmethod
    def of(cls, w_t: np.ndarray, start: int, stop: int) -> "RowPart":
        rows = w_t[start:stop]
        n_rows, n_in = rows.shape
        n_chunks = max(1, -(-rows.nbytes // CHUNK_BYTES))  # ceil
        chunk = max(1, n_rows // n_chunks)
        n_chunks = n_rows // chunk
        return cls(start, stop, rows, rows[: n_chunks * chunk].reshape(n_chunks, 1, chunk, n_in))


class Linear:
    """A projection y = x @ W + b, with W kept transposed for speed.

    GPT-2's checkpoint stores W as [n_in, n_out] (its Conv1D layout). We keep
    w_t = W.T as a contiguous [n_out, n_in] array, made once at load time,
    because of how OpenBLAS treats a handful of rows (see `linear`), and split
    its rows into SPLIT_PARTS parts, one per core (views, no copies).
    `weight` gives W back as the checkpoint has it (a view, no copy).
    """

    def __init__(self, w_t: np.ndarray, b: np.ndarray | None):
        self.w_t = np.ascontiguousarray(w_t)  # [n_out, n_in], float32 (float64 for the exact-greedy option)
        assert self.w_t.dtype in (np.float32, np.float64), f"weights must be float32 or float64, not {w_t.dtype}"
        self.b = b  # [n_out], or None for the bias-free LM head
        n_out = self.w_t.shape[0]
        n_parts = max(1, min(SPLIT_PARTS, n_out // 16)) if self.w_t.nbytes >= SMALL_BYTES else 1
        # Part boundaries on multiples of 16 rows (whole cache lines of y), the last part takes the rest.
        edges = split_edges(n_out, n_parts)
        self.parts = [RowPart.of(self.w_t, a, b) for a, b in zip(edges, edges[1:])]

    @classmethod
    def from_checkpoint(cls, w: np.ndarray, b: np.ndarray | None) -> "Linear":
        return cls(transposed_copy(w), b)  # [n_in, n_out] -> [n_out, n_in]

    @property
    def weight(self) -> np.ndarray:
        return self.w_t.T  # [n_in, n_out], as in the checkpoint


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


class KVCache:
    """Keys and values of every layer for the tokens processed so far.

    Indexed by position, like llama2.c's run state: `length` is the number of
    valid positions; the forward pass writes new keys/values at
    [length, length + n_seq) and then advances it.

    Rolling back is just `cache.length = n` (see `rollback`): the entries past n
    are stale and get overwritten by the next forward call. Speculative decoding
    does this after every round to drop the rejected draft tokens.

    Storage grows geometrically up to `capacity` (default n_ctx), so a short
    generation does not hold memory for the whole context. (np.zeros is not
    reliably lazy: with transparent huge pages, one write can make a whole
    large array resident.)
    """

    def __init__(self, hparams: HParams, capacity: int | None = None, reserve: int = 64, dtype=F32):
        self.dtype = np.dtype(dtype)  # the model's: float32, or float64 under GPT2.astype(np.float64)
        self.capacity = hparams.n_ctx if capacity is None else capacity
        if not 1 <= self.capacity <= hparams.n_ctx:
            raise ValueError(f"cache capacity must be in 1..{hparams.n_ctx}, got {self.capacity}")
        self.hparams = hparams
        self.length = 0
        self.k = self.v = None  # each [n_layer, n_head, allocated positions, d_head]
        self._allocate(min(reserve, self.capacity))

    def _allocate(self, n_positions: int) -> None:
        h = self.hparams
        shape = (h.n_layer, h.n_head, n_positions, h.d_head)
        k, v = np.zeros(shape, dtype=self.dtype), np.zeros(shape, dtype=self.dtype)
        if self.k is not None:  # keep what is cached
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def reserve(self, n_positions: int) -> None:
        """Make room for n_positions in all, doubling the storage as needed."""
        if n_positions > self.capacity:
            raise ValueError(
                f"{n_positions} positions exceed the cache capacity of {self.capacity} "
                f"(the model's context is {self.hparams.n_ctx})"
            )
        allocated = self.k.shape[2]
        if n_positions > allocated:
            self._allocate(min(self.capacity, max(n_positions, 2 * allocated)))

    def rollback(self, length: int) -> None:
        """Forget every position from `length` on (O(1): nothing is copied)."""
        assert 0 <= length <= self.length, f"cannot roll back to {length} from {self.length}"
        self.length = length

    def keep(self, start: int, rows) -> None:
        """Keep, of the positions from `start` on, only `rows`, moved to start, start + 1, ...

        After a tree round the cache holds one entry per tree node, in the flat
        order of the verification pass: the accepted path's keys and values lie
        scattered among rejected siblings. `rows` lists the path's offsets from
        `start` (increasing: a parent precedes its children); they are copied to
        contiguous positions, so the next round's queries see exactly the
        accepted text at positions start .. start + len(rows) - 1.

        NOTE: a key's position is baked in only through the position embedding
        added to the token *before* the first layer, and the tree already gave
        each node position start + depth. So a node at depth d, moved to
        start + d, carries exactly the keys/values a plain pass over the
        accepted text would have written there: a copy, no recomputation.

        For example keep(10, [0, 2, 5]) moves positions 10, 12, 15 to 10, 11, 12
        and sets the length to 13. The leading rows already in place (rows[j] == j)
        are not copied: a chain round (rows = 0, 1, .., m-1) is a zero-copy
        rollback, as before trees.
        """
        rows = np.asarray(rows, dtype=np.intp)
        m = len(rows)
        assert m == 0 or (rows[0] >= 0 and np.all(np.diff(rows) > 0)), f"rows must increase from 0 or more: {rows}"
        assert start + (rows[-1] + 1 if m else 0) <= self.length, f"rows {rows} past the cache end {self.length}"
        moved = np.flatnonzero(rows != np.arange(m))  # rows[j] != j from the first moved one on
        if len(moved):
            j = int(moved[0])
            # NOTE: fancy indexing on the right makes a copy first, so sources and
            # destinations may overlap (they do: rows[j] > j for every moved row).
            self.k[:, :, start + j : start + m] = self.k[:, :, start + rows[j:]]
            self.v[:, :, start + j : start + m] = self.v[:, :, start + rows[j:]]
        self.length = start + m


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


def linear(x: np.ndarray, lin: Linear) -> np.ndarray:
    """[n_seq, n_in] @ [n_in, n_out] + [n_out] -> [n_seq, n_out]

    Decoding is memory-bound: each weight matrix is read from RAM once per
    forward call, and for one token that read is the whole cost. For 2..16
    tokens, OpenBLAS's matrix-matrix kernel first repacks all of W, costing
    about 3.6x a 1-token call; instead each core takes its part of W's rows
    (`Linear.parts`, on specdec's own threads, threads.py) and hands np.matmul
    a stack of matrix-vector products over L2-sized chunks of those rows
    (`part_product`). Measurements and the variants that did not help: README,
    "Performance".
    """
    n_seq = x.shape[0]
    unsplit = len(lin.parts) == 1 or n_seq == 1 and not SPLIT_ONE_TOKEN
    if n_seq > MAX_CHUNKED_ROWS or unsplit and (n_seq == 1 or lin.w_t.nbytes < SMALL_BYTES):
        # Many tokens (a prompt): the matrix-matrix kernel's repacking pays off,
        # with OpenBLAS's own threads. Unsplit, one token is OpenBLAS's matrix-vector
        # product over both cores, and a tiny matrix is cached anyway.
        y = x @ lin.w_t.T
    else:
        y = np.empty((n_seq, lin.w_t.shape[0]), dtype=np.result_type(x, lin.w_t))
        jobs = [lambda part=part: part_product(x, part, y[:, part.start : part.stop]) for part in lin.parts]
        threads.workers(len(jobs)).run(jobs)
    if lin.b is not None:
        y += lin.b
    return y  # [n_seq, n_out]


def part_product(x: np.ndarray, part: RowPart, out: np.ndarray) -> None:
    """out = x @ part.w_t.T: [n_seq, n_in] -> [n_seq, stop - start], into the caller's columns of y.

    One token: one matrix-vector product. A few tokens: a stack of them, one per
    (chunk, token); np.matmul loops over the stack in C with the chunk
    outermost, so each chunk comes from RAM once and is re-read from L2 cache for
    the other tokens.
    """
    n_seq, n_in = x.shape
    if n_seq == 1:
        np.matmul(x, part.w_t.T, out=out)
        return
    rows = min(SMALL_GEMM_ROWS, SMALL_GEMM_MNK // (n_in * n_seq) // 8 * 8)  # a multiple of 8 (32-byte runs of y)
    if SMALL_GEMM and rows >= 8:
        n_blocks = out.shape[1] // rows
        n_main = n_blocks * rows
        blocks = part.w_t[:n_main].reshape(n_blocks, rows, n_in)  # a view
        # [n_blocks, rows, n_in] @ [n_in, n_seq] -> [n_blocks, rows, n_seq]
        out[:, :n_main] = np.matmul(blocks, x.T).reshape(n_main, n_seq).T
        if n_main < out.shape[1]:
            out[:, n_main:] = x @ part.w_t[n_main:].T
        return
    n_chunks, _, chunk, _ = part.chunks.shape
    n_main = n_chunks * chunk
    # [n_chunks, 1, chunk, n_in] @ [1, n_seq, n_in, 1] -> [n_chunks, n_seq, chunk, 1]
    # NOTE: let matmul allocate this chunk-major output; an out= view with
    # the token axis first makes NumPy reorder the loop and lose the cache reuse.
    stacked = np.matmul(part.chunks, x[None, :, :, None])
    out[:, :n_main] = stacked.reshape(n_chunks, n_seq, chunk).transpose(1, 0, 2).reshape(n_seq, n_main)
    if n_main < out.shape[1]:  # the few rows left over after even chunks
        out[:, n_main:] = x @ part.w_t[n_main:].T


def tree_mask(parents) -> np.ndarray:
    """Which new tokens each new token may attend to: [n_seq] parents -> [n_seq, n_seq] bool.

    parents[i] is the index of token i's parent among the new tokens, or -1 when
    its parent is the last cached position; a parent comes before its children.
    mask[i, j] is True when j is i itself or one of its ancestors, so each node
    sees exactly its own root-to-node path, never a sibling or a cousin. Every
    node also sees all cached positions (not part of this array). A chain,
    parents = [-1, 0, 1, ...], gives the usual lower-triangular causal mask.

    >>> tree_mask([-1, 0, 0, 1]).astype(int)  # a root, two children, one grandchild
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [1, 0, 1, 0],
           [1, 1, 0, 1]])

    A node's depth (0 for a child of the cache) is its row sum minus one.
    """
    parents = np.asarray(parents)
    n_seq = len(parents)
    if parents.ndim != 1 or not np.issubdtype(parents.dtype, np.integer) or n_seq == 0:
        raise ValueError(f"parents must be a non-empty 1-D list of ints, got {parents!r}")
    bad = np.flatnonzero((parents < -1) | (parents >= np.arange(n_seq)))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"parents[{i}] = {parents[i]}: each parent must be -1 (the cache) or an earlier new token's index "
            f"(list the tree's nodes parents first)"
        )
    mask = np.zeros((n_seq, n_seq), dtype=bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = mask[parent]  # everything the parent sees ...
        mask[i, i] = True  # ... and itself
    return mask


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
    """One pre-LayerNorm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).  [n_seq, n_embd]

    Writes this layer's new keys and values into the cache at positions
    [cache.length, cache.length + n_seq); the caller advances cache.length once
    after all layers. bias: the attention mask, see `attention`.
    """
    n_seq, n_embd = x.shape
    n_head, d_head = hparams.n_head, hparams.d_head
    n_past = cache.length
    n_kv = n_past + n_seq
    eps = hparams.layer_norm_epsilon

    # Multi-head causal self-attention.
    h = layer_norm(x, block.ln_1_weight, block.ln_1_bias, eps)  # [n_seq, n_embd]
    qkv = linear(h, block.attn_c_attn)  # [n_seq, 3*n_embd]
    # [n_seq, 3*n_embd] -> [3, n_head, n_seq, d_head]: split q/k/v, then heads.
    qkv = qkv.reshape(n_seq, 3, n_head, d_head).transpose(1, 2, 0, 3)
    q, k_new, v_new = qkv[0], qkv[1], qkv[2]  # each [n_head, n_seq, d_head]
    cache.k[layer, :, n_past:n_kv] = k_new
    cache.v[layer, :, n_past:n_kv] = v_new
    k = cache.k[layer, :, :n_kv]  # [n_head, n_kv, d_head]
    v = cache.v[layer, :, :n_kv]  # [n_head, n_kv, d_head]
    a = attention(q, k, v, bias)  # [n_head, n_seq, d_head]
    a = a.transpose(1, 0, 2).reshape(n_seq, n_embd)  # merge heads: [n_seq, n_embd]
    x = x + linear(a, block.attn_c_proj)

    # Position-wise feed-forward network.
    h = layer_norm(x, block.ln_2_weight, block.ln_2_bias, eps)  # [n_seq, n_embd]
    h = gelu(linear(h, block.mlp_c_fc))  # [n_seq, 4*n_embd]
    return x + linear(h, block.mlp_c_proj)  # [n_seq, n_embd]


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
    """Run n_seq new tokens through GPT-2 after the cache's n_past tokens.

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
    n_seq = len(tokens)
    n_past = cache.length
    n_layer = hparams.n_layer if n_layer is None else n_layer
    if not 1 <= n_layer <= hparams.n_layer:
        raise ValueError(f"n_layer must be in 1..{hparams.n_layer}, got {n_layer}")
    if n_seq < 1:
        raise ValueError("forward needs at least one new token")
    cache.reserve(n_past + n_seq)
    tokens = np.asarray(tokens)
    if tokens.min() < 0 or tokens.max() >= hparams.n_vocab:
        raise ValueError(f"token ids must lie in 0..{hparams.n_vocab - 1}")

    if parents is None:  # a chain: token i at position n_past + i sees new tokens 0..i
        visible = np.tri(n_seq, dtype=bool)  # [n_seq, n_seq] lower triangle
        positions = n_past + np.arange(n_seq)  # [n_seq]
    else:
        if len(parents) != n_seq:
            raise ValueError(f"parents has {len(parents)} entries for {n_seq} tokens: give one per token")
        visible = tree_mask(parents)  # [n_seq, n_seq]
        # NOTE: a node's position is n_past + its depth, not n_past + its index in the flat batch.
        positions = n_past + visible.sum(axis=1) - 1  # [n_seq]
    bias = None
    if n_seq > 1:  # 0 where query i may attend to key j, -inf elsewhere; all cached keys are visible
        seen = np.concatenate([np.ones((n_seq, n_past), dtype=bool), visible], axis=1)  # [n_seq, n_kv]
        bias = np.where(seen, F32(0), F32(-np.inf))

    x = weights.wte[tokens] + weights.wpe[positions]  # [n_seq, n_embd]
    for layer in range(n_layer):
        x = transformer_block(x, weights.blocks[layer], hparams, cache, layer, bias)
    cache.length = n_past + n_seq

    if last_only and not return_hidden:
        x = x[-1:]  # [1, n_embd]
    x = layer_norm(x, weights.ln_f_weight, weights.ln_f_bias, hparams.layer_norm_epsilon)
    logits = linear(x[-1:] if last_only else x, weights.lm_head)  # [n_seq, n_embd] @ [n_embd, n_vocab]
    return (logits, x) if return_hidden else logits  # logits: [n_seq (or 1), n_vocab]


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
