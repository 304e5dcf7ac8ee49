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
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from .cache import KVCache
from .kernels import Linear, pass_threads
from .packing import PREFILL_CHUNK, in_chunks, lm_head_rows, pack


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

    def forward(self, tokens, cache: KVCache, last_only: bool = False, n_layer: int | None = None,
                return_hidden: bool = False, parents=None): ...  # fmt: skip

    def forward_batch(self, tokens: list, caches: list[KVCache], last_only: bool = False,
                      n_layer: int | None = None, return_hidden: bool = False, parents: list | None = None): ...  # fmt: skip

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

    def embed_and_run(self, flat: np.ndarray, positions: np.ndarray, rows: list, n_layer: int,
                      states: dict | None = None) -> np.ndarray:  # fmt: skip
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

    def forward(self, tokens, cache: KVCache, last_only: bool = False, n_layer: int | None = None,
                return_hidden: bool = False, parents=None):  # fmt: skip
        """Run n_seq new tokens after the cache's n_past tokens: `forward_batch` of one row.

        tokens: [n_seq] int.  Returns float32 logits, [n_seq, n_vocab], or [1, n_vocab]
        for the last new token only when `last_only` (the LM head is the largest
        matrix in the model, so skipping rows nobody reads matters).

        A chain of more than PREFILL_CHUNK tokens (a long prompt) runs as consecutive
        passes of at most that many (packing.in_chunks): the same results, and attention's
        scores never larger than [n_head, PREFILL_CHUNK, n_kv].

        `n_layer` runs only the first n_layer blocks before the final norm and the LM
        head: the early-exit draft of self-speculative decoding. It writes keys/values
        for those layers only, so its caller must roll the cache back before a full pass.

        `parents` ([n_seq] ints, see attention.tree_mask) makes the new tokens a tree:
        node i attends to the cache, its ancestors and itself, and sits at position
        n_past + depth(i). None is a chain, parents = [-1, 0, 1, ...]. The cache then
        holds one entry per node in this flat order; `KVCache.keep` compacts the
        accepted path afterwards.

        `return_hidden` returns (logits, hidden) instead, hidden [n_seq, n_embd] being
        the final hidden state after the final norm (what the LM head reads; what
        learned draft heads read), for every new token even when `last_only` trims the logits.
        `return_hidden` may instead list layers (features.py's numbering: 0 the embeddings,
        l the residual stream after l blocks, n_layer the final state after the norm):
        hidden is then [n_seq, len(layers) * n_embd], those states side by side (EAGLE-3's
        low, middle and high features).

        NOTE: this calls LanguageModel's own methods, never a subclass's override, so a
        subclass that post-processes logits (drafters/restricted.py) does it once.
        """
        out = LanguageModel.forward_batch(self, [tokens], [cache], last_only, n_layer, return_hidden, [parents])
        return (out[0][0], out[1][0]) if return_hidden else out[0]

    def forward_batch(self, tokens: list, caches: list[KVCache], last_only: bool = False,
                      n_layer: int | None = None, return_hidden: bool = False, parents: list | None = None):  # fmt: skip
        """A ragged batch: row b's new tokens tokens[b] ([n_seq_b] ints) after caches[b]'s n_past_b tokens.

        Each row brings its own tokens, its own KV cache and its own cache length,
        so rows may differ in both (after a round of speculative decoding they do:
        each row accepted a different number of drafts). The rows' new tokens are
        packed into one [n_tok, n_embd] matrix, n_tok = sum of n_seq_b, so every
        weight matrix is read once for the whole batch; attention runs per row
        against the row's own cache. Rolling back stays per row: caches[b].rollback(n).

        Returns a list with one [n_seq_b, n_vocab] logits array per row ([1, n_vocab]
        with `last_only`), or (logits list, hidden list) with `return_hidden`.
        `n_layer`, `parents` (one entry per row, None for a chain) and the rest: as
        in `forward`, which is this function for a batch of one.

        Chains of more than PREFILL_CHUNK new tokens in all (long prompts, or many
        prompts) run as consecutive passes of at most PREFILL_CHUNK tokens in all
        (packing.in_chunks says how the rows are cut, and why the budget is per pass),
        so neither attention's scores nor the packed activations grow with the batch.
        Trees are never cut (a tree's nodes are a verification pass: a few tokens).
        """
        n_layer = self.n_layer if n_layer is None else n_layer
        if not 1 <= n_layer <= self.n_layer:
            raise ValueError(f"n_layer must be in 1..{self.n_layer}, got {n_layer}")
        layers = None if isinstance(return_hidden, bool) else [int(layer) for layer in return_hidden]
        if layers is not None and not all(0 <= layer <= n_layer for layer in layers):
            raise ValueError(f"hidden states are of layers 0..{n_layer}, not {layers}")
        chains = parents is None or all(row_parents is None for row_parents in parents)
        if chains and sum(len(row_tokens) for row_tokens in tokens) > PREFILL_CHUNK:  # long prompts: in passes

            def run(parts, part_caches):  # one pass of at most PREFILL_CHUNK tokens, after what earlier ones cached
                return LanguageModel.forward_batch(self, parts, part_caches, last_only, n_layer, return_hidden)

            return in_chunks(run, tokens, caches, last_only, return_hidden, PREFILL_CHUNK)
        flat, positions, rows = pack(self.hparams, tokens, caches, parents)  # [n_tok], [n_tok], one Row per row
        with pass_threads(len(flat)):  # OpenBLAS on one thread for a few tokens (kernels.pass_threads)
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

    def __call__(self, tokens) -> np.ndarray:
        """[n_seq] token ids -> [n_seq, n_vocab] float32 logits, no cache kept."""
        tokens = np.asarray(tokens)
        if not 1 <= len(tokens) <= self.n_ctx:
            raise ValueError(f"need 1..{self.n_ctx} tokens, got {len(tokens)}")
        return self.forward(tokens, self.new_cache(len(tokens)))
