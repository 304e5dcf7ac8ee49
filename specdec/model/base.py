"""The model seam: what every sampler, drafter and cost formula may ask of a model, and what architectures share.

`CausalLM` is the interface: a causal language model with a KV cache, that runs
new tokens (a chain, a tree, or a ragged batch of sequences) after its cache,
can stop after its first n_layer blocks (early exit) and return the hidden
state the LM head reads, and says how many weights one decoding step reads
(`step_weights`: the cost model's c comes from it). Code outside model/ and
checkpoints/ should annotate models with it, never with an architecture.

`LanguageModel` is the one implementation of that interface's plumbing, shared
by gpt2.GPT2 and llama.Llama: hyperparameters, weights and tokenizer held
together, the n_* properties, `new_cache`, `astype`, `forward` (`forward_batch`
of one row), `forward_batch` (long prompts in chunks) and `__call__`. An
architecture supplies only what differs:

    embed_and_run(flat, positions, rows, n_layer, states)  token ids -> the residual stream after n_layer blocks
    final_norm(x)                                  the norm before the LM head
    block_weights()                                weights one block reads (`step_weights` adds the rest)
    cast(convert)                                  a copy of the model with `convert` applied to every weight

Shape notation as in gpt2.py.

`forward(tokens, cache)` runs n_seq new tokens after the cache's n_past tokens
and returns float32 logits [n_seq, n_vocab]. Its options:
- `last_only`: logits of the last new token only, [1, n_vocab] (the LM head is
  the largest matrix in the model, so skipping rows nobody reads matters).
- `n_layer`: only the first n_layer blocks before the final norm and the LM head:
  the early-exit draft of self-speculative decoding. It writes keys and values for
  those layers only, so its caller rolls the cache back before a full pass.
- `parents` ([n_seq] ints, attention.tree_mask) makes the new tokens a tree: node
  i attends to the cache, its ancestors and itself, and sits at position
  n_past + depth(i). The cache then holds one entry per node in this flat order;
  `KVCache.keep` compacts the accepted path afterwards.
- `return_hidden`: (logits, hidden) instead, hidden [n_seq, n_embd] the final
  hidden state after the final norm (what the LM head reads, and what learned
  draft heads read), for every new token even when `last_only` trims the logits.
  It may instead list layers (0 the embeddings, l the residual stream after l
  blocks, n_layer the final state after the norm): hidden is then
  [n_seq, len(layers) * n_embd], those states side by side (EAGLE-3's features).

`forward_batch(tokens, caches)` is the same over a ragged batch, and `forward` is
it for a batch of one row: row b brings its own new tokens, its own KV cache and
its own cache length, so rows may differ in both (after a round of speculative
decoding they do). The rows' new tokens are packed into one [n_tok, n_embd]
matrix (`pack`; n_tok = the sum of the rows' n_seq), so each weight matrix is ONE
product for the whole batch, where decoding spends its time; attention runs per
row against the row's own cache (a `Row` says which rows of the packed matrix are
whose, where its cache stands and what its tokens may see), and rolling back
stays per row. `lm_head_rows` splits the logits back into rows. A long prompt, or
a batch of them, runs as consecutive passes of at most PREFILL_CHUNK new tokens in
all (`in_chunks`): the same results, and attention's scores never larger than
[n_head, PREFILL_CHUNK, n_kv]. Trees are never cut (a tree is a verification
pass: a few tokens).

NOTE: `forward` calls LanguageModel's own forward_batch, never a subclass's
override, so a subclass that post-processes logits (restricted.py) does it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from . import linear
from .attention import KVCache, tree_mask
from .linear import Linear

F32 = np.float32

# New tokens per pass of a long prompt or a batch of them (`in_chunks`): attention's scores are then at most
# [n_head, PREFILL_CHUNK, n_kv] and its mask [PREFILL_CHUNK, n_kv], never [n_kv, n_kv]
# (an 8,000-token prompt on SmolLM2: 147 MB instead of 2.3 GB per layer). Each chunk is still
# hundreds of rows per product, where the matrix-matrix kernel runs at full speed.
PREFILL_CHUNK = 512


def weights_per_step(n_layer: int, block_weights: int, head_rows: int, n_embd: int) -> int:
    """Weights one 1-token step reads: n_layer blocks, then an LM head scoring head_rows tokens ([head_rows, n_embd]).
    (The final norm's n_embd weights are left out: a rounding error beside the head.)"""
    return n_layer * block_weights + head_rows * n_embd


@runtime_checkable
class CausalLM(Protocol):
    """Any model specdec decodes with (gpt2.GPT2, llama.Llama, drafters/restricted.py's restricted heads)."""

    name: str
    tokenizer: Any  # a tiktoken.Encoding, or None for a tokenizer-less test model
    hparams: Any  # n_vocab, n_ctx, n_embd, n_head, n_kv_head, n_layer, d_head, layer_norm_epsilon
    weights: Any  # .wte [n_vocab, n_embd], .lm_head (a Linear), .blocks (draft heads read these)

    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def n_head(self) -> int: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def dtype(self) -> np.dtype: ...

    def new_cache(self, capacity: int | None = None) -> KVCache: ...

    def forward(self, tokens, cache: KVCache, last_only=False, n_layer=None, return_hidden=False, parents=None): ...

    def forward_batch(
        self, tokens: list, caches: list[KVCache], last_only=False, n_layer=None, return_hidden=False, parents=None
    ): ...

    def __call__(self, tokens) -> np.ndarray: ...

    def step_weights(self, n_layer: int | None = None) -> int: ...

    def astype(self, dtype) -> CausalLM: ...


class LanguageModel:
    """A model ready to run: hyperparameters, weights and (optionally) its tokenizer.

    `model(tokens)` is the cache-free convenience call: logits for every position
    of a fresh sequence. Decoders use `new_cache()` and `forward()`.
    """

    def __init__(self, hparams, weights, tokenizer=None, name: str = "model"):
        self.hparams = hparams
        self.weights = weights
        self.tokenizer = tokenizer  # a tiktoken.Encoding, or None for tokenizer-less test models
        self.name = name

    # Hyperparameters read like attributes of the model: model.n_vocab, ...
    n_vocab = property(lambda self: self.hparams.n_vocab)
    n_ctx = property(lambda self: self.hparams.n_ctx)
    n_embd = property(lambda self: self.hparams.n_embd)
    n_head = property(lambda self: self.hparams.n_head)
    n_layer = property(lambda self: self.hparams.n_layer)

    @property
    def dtype(self) -> np.dtype:
        return self.weights.wte.dtype  # float32, or float64 after astype(np.float64)

    # --- what each architecture supplies -----------------------------------

    def embed_and_run(
        self, flat: np.ndarray, positions: np.ndarray, rows: list, n_layer: int, states: dict | None = None
    ) -> np.ndarray:
        """[n_tok] token ids at [n_tok] positions -> [n_tok, n_embd] after the first n_layer blocks.
        states: {layer: None, ...}, filled in with the residual stream after that many blocks (0: the embeddings)."""
        raise NotImplementedError

    def final_norm(self, x: np.ndarray) -> np.ndarray:
        """The norm the LM head reads through.  [n_tok, n_embd] -> [n_tok, n_embd]"""
        raise NotImplementedError

    def block_weights(self) -> int:
        """Weights (numbers, not bytes) one block reads for one token."""
        raise NotImplementedError

    def cast(self, convert) -> LanguageModel:
        """A copy of this model with `convert` applied to every weight array or Linear."""
        raise NotImplementedError

    # --- shared --------------------------------------------------------------

    def step_weights(self, n_layer: int | None = None) -> int:
        """Weights read by one decoding step through n_layer blocks and the LM head: the cost model's c
        is a draft's step_weights over the target's (a CPU step is memory-bound). The LM head counts the
        rows it scores: a restricted head (drafters/restricted.py) reads fewer."""
        n_layer = self.n_layer if n_layer is None else n_layer
        head_rows = self.weights.lm_head.w_t.shape[0]  # [n_vocab (or fewer), n_embd]
        return weights_per_step(n_layer, self.block_weights(), head_rows, self.n_embd)

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(self.hparams, capacity, dtype=self.dtype)

    def astype(self, dtype) -> LanguageModel:
        """This model with every weight converted to `dtype` (np.float32 or np.float64): a copy.

        float64 is the exact-greedy option. In float32, a (K+1)-token verification
        pass and a 1-token step add the same numbers in different orders, so
        their logits differ by about 1e-6 relative, and where the two best tokens
        lie that close, greedy speculative decoding can pick differently from
        greedy autoregressive decoding. In float64 the two agree wherever the top
        two logits differ by more than about 1e-13, so in practice always.
        It costs twice the memory and, decoding being memory-bound, about twice
        the time per step (docs/performance.md). The draft can stay float32.
        """
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"a {type(self).__name__} computes in float32 or float64, not {dtype}")

        def convert(value):
            if isinstance(value, Linear):
                return Linear(value.w_t.astype(dtype), None if value.b is None else value.b.astype(dtype))
            return value.astype(dtype)

        return self.cast(convert)

    def forward(self, tokens, cache: KVCache, last_only=False, n_layer=None, return_hidden=False, parents=None):
        """[n_seq] new tokens after the cache's -> [n_seq, n_vocab] logits (options: the module docstring)."""
        out = LanguageModel.forward_batch(self, [tokens], [cache], last_only, n_layer, return_hidden, [parents])
        return (out[0][0], out[1][0]) if return_hidden else out[0]

    def forward_batch(
        self, tokens: list, caches: list[KVCache], last_only=False, n_layer=None, return_hidden=False, parents=None
    ):
        """Row b's new tokens[b] after caches[b]'s, in one pass -> one logits array per row (and hidden states)."""
        n_layer, layers = self.check_pass(n_layer, return_hidden)
        if all(p is None for p in parents or [None]) and sum(map(len, tokens)) > PREFILL_CHUNK:  # a long prompt

            def run(parts, part_caches):  # one pass of at most PREFILL_CHUNK tokens, after what earlier ones cached
                return LanguageModel.forward_batch(self, parts, part_caches, last_only, n_layer, return_hidden)

            return in_chunks(run, tokens, caches, last_only, return_hidden, PREFILL_CHUNK)
        flat, positions, rows = pack(self.hparams, tokens, caches, parents)  # [n_tok], [n_tok], one Row per row
        with linear.PRODUCTS.pass_of(len(flat)):  # nothing, or what the fast products set for a pass (fast/)
            states = None if layers is None else {layer: None for layer in layers if layer < self.n_layer}
            x = self.embed_and_run(flat, positions, rows, n_layer, states)  # [n_tok, n_embd]
            for row in rows:
                row.cache.length = row.n_past + row.stop - row.start
            out = lm_head_rows(x, rows, last_only, bool(return_hidden), self.final_norm, self.weights.lm_head)
        if layers is None:
            return out
        final = np.concatenate(out[1])  # [n_tok, n_embd] after the final norm (layer n_layer)
        wide = np.concatenate([final if layer == self.n_layer else states[layer] for layer in layers], axis=1)
        return out[0], [wide[row.start : row.stop] for row in rows]

    def check_pass(self, n_layer: int | None, return_hidden) -> tuple[int, list[int] | None]:
        """n_layer checked (None: all), and the layers return_hidden lists (None when it is a bool)."""
        n_layer = self.n_layer if n_layer is None else n_layer
        if not 1 <= n_layer <= self.n_layer:
            raise ValueError(f"n_layer must be in 1..{self.n_layer}, got {n_layer}")
        layers = None if isinstance(return_hidden, bool) else [int(layer) for layer in return_hidden]
        if layers is not None and not all(0 <= layer <= n_layer for layer in layers):
            raise ValueError(f"hidden states are of layers 0..{n_layer}, not {layers}")
        return n_layer, layers

    def __call__(self, tokens) -> np.ndarray:
        """[n_seq] token ids -> [n_seq, n_vocab] float32 logits, no cache kept."""
        tokens = np.asarray(tokens)
        if not 1 <= len(tokens) <= self.n_ctx:
            raise ValueError(f"need 1..{self.n_ctx} tokens, got {len(tokens)}")
        return self.forward(tokens, self.new_cache(len(tokens)))


# ---------------------------------------------------------------------------
# A ragged batch in one matrix (the module docstring).
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One sequence of a packed ragged batch (`forward_batch`), as the attention of a block sees it.

    Its n_seq new tokens are rows start:stop of the packed [n_tok, n_embd] matrix;
    their keys and values go into `cache` at n_past .. n_past + n_seq - 1.
    """

    start: int  # first row of this sequence in the packed matrix
    stop: int  # one past its last row
    cache: KVCache  # this sequence's own KV cache
    n_past: int  # cache.length before the pass
    bias: np.ndarray | None  # [n_seq, n_past + n_seq] attention mask (see `attention`), None for one token


ROWS_AND_CACHES = "a batch needs one cache per row and at least one row, got {} rows and {} caches"


def check_rows(tokens: list, caches: list[KVCache]) -> None:
    """At least one row, one cache of its own per row, and at least one new token in every row."""
    if len(tokens) == 0 or len(tokens) != len(caches):
        raise ValueError(ROWS_AND_CACHES.format(len(tokens), len(caches)))
    if len({id(c) for c in caches}) != len(caches):
        raise ValueError("every row of a batch needs its own KV cache: two rows were given the same one")
    if any(len(row_tokens) < 1 for row_tokens in tokens):
        raise ValueError("forward needs at least one new token (in every row of a batch)")


def pack(hparams, tokens: list, caches: list[KVCache], parents: list | None) -> tuple[np.ndarray, np.ndarray, list]:
    """Check a ragged batch and lay it out: packed token ids [n_tok], their positions [n_tok], one Row per row."""
    check_rows(tokens, caches)
    rows, positions, start = [], [], 0
    for row_tokens, cache, row_parents in zip(tokens, caches, parents or [None] * len(tokens)):
        n_seq, n_past = len(row_tokens), cache.length
        cache.reserve(n_past + n_seq)
        # Which new tokens each new token sees: a chain's lower triangle, or a tree's path (attention.tree_mask).
        visible = np.tri(n_seq, dtype=bool) if row_parents is None else tree_mask(row_parents, n_seq)
        # NOTE: a token's position is n_past + its depth: a chain's index, but a tree node's depth, not its index.
        positions.append(n_past + visible.sum(axis=1) - 1)  # [n_seq]
        seen = np.concatenate([np.ones((n_seq, n_past), dtype=bool), visible], axis=1)  # [n_seq, n_kv]
        bias = np.where(seen, F32(0), F32(-np.inf)) if n_seq > 1 else None  # 0 where i may attend to j, else -inf
        rows.append(Row(start, start + n_seq, cache, n_past, bias))
        start += n_seq
    flat = np.concatenate([np.asarray(t).reshape(-1) for t in tokens])  # [n_tok]
    if flat.min() < 0 or flat.max() >= hparams.n_vocab:
        raise ValueError(f"token ids must lie in 0..{hparams.n_vocab - 1}")
    return flat, np.concatenate(positions), rows


def lm_head_rows(x: np.ndarray, rows: list[Row], last_only: bool, return_hidden: bool, norm, lm_head: Linear):
    """The final norm and the LM head over a packed batch, split back into rows: each row's logits (its last
    token's only, with last_only) and, with return_hidden, each row's hidden states after the norm."""
    h = norm(x)  # [n_tok, n_embd]
    logits = h[[row.stop - 1 for row in rows]] @ lm_head if last_only else h @ lm_head  # [n_rows or n_tok, n_vocab]
    per_row = [logits[i : i + 1] if last_only else logits[row.start : row.stop] for i, row in enumerate(rows)]
    return (per_row, [h[row.start : row.stop] for row in rows]) if return_hidden else per_row


def in_chunks(run, tokens: list, caches: list[KVCache], last_only: bool, return_hidden, chunk: int = PREFILL_CHUNK):
    """A batch of chains as consecutive passes of at most `chunk` new tokens in all, each after what the passes
    before it cached: run(parts, part_caches) is the model's forward_batch over the rows a pass holds.

    The rows' new tokens are laid end to end and cut every `chunk` tokens, so a pass
    holds the rest of one row, whole rows, and the start of another; a row leaves once
    its tokens are done. Token i of a row attends to exactly the positions it would in
    one pass (every earlier one of its row), so logits, hidden states and caches equal
    one pass's up to float32 rounding (the products' blocking differs). Returns what
    one pass returns: one logits array per row, [n_seq_b, n_vocab] ([1, n_vocab] with
    last_only: the row's last pass's), or (logits list, hidden list). A pass that
    fails leaves every cache where it was.

        lengths [20, 5, 13], chunk 8  ->  passes  row 0 [0:8] | row 0 [8:16] | row 0 [16:20], row 1 [0:4]
                                                  | row 1 [4:5], row 2 [0:7] | row 2 [7:13]

    NOTE: the budget is per pass, not per row. Attention runs row by row, so its
    scores are at most [n_head, chunk, n_kv_b] either way; but the packed activations
    ([n_tok, n_ff] and wider) grow with the pass's total, and a budget per row would
    let 16 rows make a pass of 16 x chunk tokens. A pass of `chunk` tokens in all is as
    large as a single long prompt's, and already long enough for full-speed products.
    """
    check_rows(tokens, caches)
    n_pasts = [cache.length for cache in caches]
    for cache, n_past, row_tokens in zip(caches, n_pasts, tokens):
        cache.reserve(n_past + len(row_tokens))  # once, not once per pass
    lengths = [len(row_tokens) for row_tokens in tokens]
    ends = np.cumsum(lengths)  # the rows end to end: row b is tokens starts[b] .. ends[b] - 1 of that stream
    starts = ends - lengths
    logits, hidden = [[] for _ in tokens], [[] for _ in tokens]  # each row's pieces, pass by pass
    try:
        for lo in range(0, int(ends[-1]), chunk):
            hi = lo + chunk
            in_pass = [b for b in range(len(tokens)) if starts[b] < hi and ends[b] > lo]
            parts = [tokens[b][max(lo - starts[b], 0) : hi - starts[b]] for b in in_pass]
            out = run(parts, [caches[b] for b in in_pass])
            out_logits, out_hidden = out if return_hidden else (out, [None] * len(in_pass))
            for b, row_logits, row_hidden in zip(in_pass, out_logits, out_hidden):
                logits[b].append(row_logits)
                hidden[b].append(row_hidden)
    except BaseException:
        for cache, n_past in zip(caches, n_pasts):
            cache.rollback(n_past)
        raise
    logits = [pieces[-1] if last_only else np.concatenate(pieces) for pieces in logits]  # [n_seq_b (or 1), n_vocab]
    return (logits, [np.concatenate(pieces) for pieces in hidden]) if return_hidden else logits
