"""A ragged batch packed into one matrix, shared by gpt2.py and llama.py.

A forward pass may take several sequences at once, each with its own new tokens
and its own KV cache (`forward_batch`). Their new tokens are stacked into one
[n_tok, n_embd] matrix, so each weight matrix is one product for the whole batch;
a `Row` says which rows of that matrix belong to which sequence, where that
sequence's cache stands, and what its new tokens may attend to (a chain's causal
mask, or a tree's `tree_mask`). `pack` checks a batch and lays it out;
`lm_head_rows` splits the final logits back into sequences. A long prompt, or a
batch of them, runs as several passes of at most PREFILL_CHUNK new tokens in all
(`in_chunks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import tree_mask
from .cache import KVCache
from .kernels import Linear, linear

F32 = np.float32

# New tokens per pass of a long prompt or a batch of them (`in_chunks`): attention's scores are then at most
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


def check_rows(tokens: list, caches: list[KVCache]) -> None:
    """A batch needs at least one row, one cache of its own per row, and at least one new token in every row."""
    if len(tokens) == 0 or len(tokens) != len(caches):
        raise ValueError(f"a batch needs one cache per row and at least one row, got {len(tokens)} rows and "
                         f"{len(caches)} caches")  # fmt: skip
    if len({id(c) for c in caches}) != len(caches):
        raise ValueError("every row of a batch needs its own KV cache: two rows were given the same one")
    if any(len(row_tokens) < 1 for row_tokens in tokens):
        raise ValueError("forward needs at least one new token (in every row of a batch)")


def pack(hparams, tokens: list, caches: list[KVCache], parents: list | None) -> tuple[np.ndarray, np.ndarray, list]:
    """Check a ragged batch and lay it out: (packed token ids [n_tok], their positions [n_tok], rows).

    Row b's tokens continue caches[b] (a chain, or a tree given parents[b]); each
    row gets its own positions and attention mask, and its cache room reserved.
    Shared by gpt2.py and llama.py.
    """
    check_rows(tokens, caches)
    parents = [None] * len(tokens) if parents is None else parents
    rows, positions, start = [], [], 0
    for row_tokens, cache, row_parents in zip(tokens, caches, parents):
        n_seq, n_past = len(row_tokens), cache.length
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
