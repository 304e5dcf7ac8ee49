"""A ragged batch packed into one matrix, shared by gpt2.py and llama.py.

A forward pass may take several sequences at once, each with its own new tokens
and its own KV cache (`forward_batch`). Their new tokens are stacked into one
[n_tok, n_embd] matrix, so each weight matrix is one product for the whole batch;
a `Row` says which rows of that matrix belong to which sequence, where that
sequence's cache stands, and what its new tokens may attend to (a chain's causal
mask, or a tree's `tree_mask`). `pack` checks a batch and lays it out;
`lm_head_rows` splits the final logits back into sequences. A long prompt runs
as several passes of at most PREFILL_CHUNK tokens (`in_chunks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import tree_mask
from .cache import KVCache
from .kernels import Linear, linear

F32 = np.float32

# Tokens per pass of a long prompt (`in_chunks`): attention's scores are then at most
# [n_head, PREFILL_CHUNK, n_kv] and its mask [PREFILL_CHUNK, n_kv], never [n_kv, n_kv]
# (an 8,000-token prompt on SmolLM2: 147 MB instead of 2.3 GB per layer). Each chunk is still
# hundreds of rows per product, where the matrix-matrix kernel runs at full speed.
PREFILL_CHUNK = 512


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


def pack(hparams, tokens: list, caches: list[KVCache], parents: list | None) -> tuple[np.ndarray, np.ndarray, list]:
    """Check a ragged batch and lay it out: (packed token ids [n_tok], their positions [n_tok], rows).

    Row b's tokens continue caches[b] (a chain, or a tree given parents[b]); each
    row gets its own positions and attention mask, and its cache room reserved.
    Shared by gpt2.py and llama.py.
    """
    if len(tokens) == 0 or len(tokens) != len(caches):
        raise ValueError(f"a batch needs one cache per row and at least one row, got {len(tokens)} rows and "
                         f"{len(caches)} caches")  # fmt: skip
    if len({id(c) for c in caches}) != len(caches):
        raise ValueError("every row of a batch needs its own KV cache: two rows were given the same one")
    parents = [None] * len(tokens) if parents is None else parents
    rows, positions, start = [], [], 0
    for row_tokens, cache, row_parents in zip(tokens, caches, parents):
        n_seq, n_past = len(row_tokens), cache.length
        if n_seq < 1:
            raise ValueError("forward needs at least one new token (in every row of a batch)")
        cache.reserve(n_past + n_seq)
        if row_parents is None:  # a chain: token i at position n_past + i sees new tokens 0..i
            visible = np.tri(n_seq, dtype=bool)  # [n_seq, n_seq] lower triangle
            row_positions = n_past + np.arange(n_seq)  # [n_seq]
        else:
            if len(row_parents) != n_seq:
                raise ValueError(f"parents has {len(row_parents)} entries for {n_seq} tokens: give one per token")
            visible = tree_mask(row_parents)  # [n_seq, n_seq]
            # NOTE: a node's position is n_past + its depth, not n_past + its index in the flat batch.
            row_positions = n_past + visible.sum(axis=1) - 1  # [n_seq]
        bias = None
        if n_seq > 1:  # 0 where query i may attend to key j, -inf elsewhere; all cached keys are visible
            seen = np.concatenate([np.ones((n_seq, n_past), dtype=bool), visible], axis=1)  # [n_seq, n_kv]
            bias = np.where(seen, F32(0), F32(-np.inf))
        rows.append(Row(start, start + n_seq, cache, n_past, bias))
        positions.append(row_positions)
        start += n_seq
    flat = np.concatenate([np.asarray(t).reshape(-1) for t in tokens])  # [n_tok]
    if flat.min() < 0 or flat.max() >= hparams.n_vocab:
        raise ValueError(f"token ids must lie in 0..{hparams.n_vocab - 1}")
    return flat, np.concatenate(positions), rows


def lm_head_rows(x: np.ndarray, rows: list[Row], last_only: bool, return_hidden: bool, norm, lm_head: Linear):
    """The final norm and the LM head over a packed batch, split back into rows (shared with llama.py).

    last_only: only each row's last token reaches the LM head, one [n_rows, n_embd]
    product (the hidden states, when asked for, are still every token's).
    """
    lasts = [row.stop - 1 for row in rows]
    if last_only and not return_hidden:
        x = x[lasts]  # [n_rows, n_embd]
        rows = [Row(i, i + 1, row.cache, row.n_past, None) for i, row in enumerate(rows)]
    x = norm(x)  # [n_tok (or n_rows), n_embd]
    if last_only and return_hidden:
        logits = linear(x[lasts], lm_head)  # [n_rows, n_vocab]
        per_row = [logits[i : i + 1] for i in range(len(rows))]
    else:
        logits = linear(x, lm_head)  # [n_tok, n_embd] @ [n_embd, n_vocab]
        per_row = [logits[row.start : row.stop] for row in rows]
    if return_hidden:
        return per_row, [x[row.start : row.stop] for row in rows]
    return per_row


def in_chunks(run, tokens, cache: KVCache, last_only: bool, return_hidden: bool, chunk: int = PREFILL_CHUNK):
    """A chain of new tokens as consecutive passes of at most `chunk` tokens, each after the cache the
    previous ones filled: run(part) is the model's forward over `part` against `cache`.

    Token i attends to exactly the positions it would in one pass (every earlier
    one), so logits, hidden states and cache equal one pass's up to float32
    rounding (the products' blocking differs). Returns what one pass returns:
    logits [n_seq, n_vocab] ([1, n_vocab] with last_only), or (logits, hidden).
    A pass that fails leaves the cache where it was.
    """
    n_past = cache.length
    cache.reserve(n_past + len(tokens))  # once, not once per chunk
    try:
        outs = [run(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    except BaseException:
        cache.rollback(n_past)
        raise
    if not return_hidden:
        return outs[-1] if last_only else np.concatenate(outs)  # [n_seq (or 1), n_vocab]
    logits = outs[-1][0] if last_only else np.concatenate([out[0] for out in outs])
    return logits, np.concatenate([out[1] for out in outs])  # hidden: [n_seq, n_embd]
