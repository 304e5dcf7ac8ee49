"""Attention and its memory, shared by every architecture in model/: the KV cache, softmax, masked attention
and the tree mask.

Shape notation as in gpt2.py (n_seq new tokens, n_kv = n_past + n_seq positions,
n_head heads of width d_head). Each architecture builds q, k and v its own way
(GPT-2 from one fused product; Llama with rotary positions and grouped key/value
heads), writes the new keys and values into the KV cache, and calls `attention`
over everything cached; which new tokens may see which is a chain's causal mask
or a tree's `tree_mask`, laid out per sequence by base.pack.

The KV cache needs only n_layer, n_kv_head (GPT-2: one key/value head per query
head; Llama's grouped-query attention: fewer), d_head and n_ctx from a model's
hyperparameters. It is indexed by position, like llama2.c's run state: `length`
is the number of valid positions; a forward pass writes new keys and values at
[length, length + n_seq) and then advances it. Rolling back is just setting the
length (`rollback`): the entries past it are stale and are overwritten by the
next pass. Speculative decoding does this after every round to drop the rejected
drafts. Storage grows geometrically up to `capacity` (default n_ctx), so a short
generation does not hold memory for the whole context. (np.zeros is not reliably
lazy: with transparent huge pages, one write can make a whole large array resident.)

The mask, in a chain: new token i sits at position n_past + i and may attend to
every cached position and to new tokens 0..i, never to new tokens after it. That
is what makes one pass over [last token, d_0 .. d_(K-1)] give, in row i, the same
logits as feeding those tokens one at a time. A tree replaces the new-token part
with `tree_mask`.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

F32 = np.float32


def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis, shifted by the max for stability, in one buffer
    (out=x: in place, which attention does with its scores, the largest arrays of a long prompt)."""
    out = np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Masked attention of n_seq new queries over n_kv = n_past + n_seq positions.

    q: [n_head, n_seq, d_head]; k, v: [n_head, n_kv, d_head] -> [n_head, n_seq, d_head]
    bias: [n_seq, n_kv], 0 where query i may attend to key j and -inf where not (None for one new token).
    """
    d_head = q.shape[2]
    scores = (q * F32(1.0 / np.sqrt(d_head))) @ k.transpose(0, 2, 1)  # [n_head, n_seq, n_kv]
    if bias is not None:
        scores += bias  # broadcast over heads
    return softmax(scores, out=scores) @ v  # [n_head, n_seq, n_kv] @ [n_head, n_kv, d_head]


def tree_mask(parents, n_seq: int | None = None) -> np.ndarray:
    """Which new tokens each new token may attend to: [n_seq] parents -> [n_seq, n_seq] bool (n_seq: checked).

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
    if n_seq is not None and len(parents) != n_seq:
        raise ValueError(f"parents has {len(parents)} entries for {n_seq} tokens: give one per token")
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


class HParams(Protocol):
    """What a cache reads from a model's hyperparameters (gpt2.HParams, llama.LlamaHParams)."""

    n_layer: int
    n_kv_head: int
    d_head: int
    n_ctx: int


class KVCache:
    """Keys and values of every layer for the tokens processed so far, by position (the module docstring)."""

    def __init__(self, hparams: HParams, capacity: int | None = None, reserve: int = 64, dtype=F32):
        self.dtype = np.dtype(dtype)  # the model's: float32, or float64 under model.astype(np.float64)
        self.capacity = hparams.n_ctx if capacity is None else capacity
        if not 1 <= self.capacity <= hparams.n_ctx:
            raise ValueError(f"cache capacity must be in 1..{hparams.n_ctx}, got {self.capacity}")
        self.hparams = hparams
        self.length = 0
        self.k = self.v = None  # each [n_layer, n_kv_head, allocated positions, d_head]
        self._allocate(min(reserve, self.capacity))

    def _allocate(self, n_positions: int) -> None:
        h = self.hparams
        shape = (h.n_layer, h.n_kv_head, n_positions, h.d_head)
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

        NOTE: a key's position is baked in only by the position the forward pass
        gave its token (GPT-2 adds a position embedding before the first layer,
        Llama rotates keys by it), and the tree already gave each node position
        start + depth. So a node at depth d, moved to start + d, carries exactly
        the keys/values a plain pass over the accepted text would have written
        there: a copy, no recomputation.

        For example keep(10, [0, 2, 5]) moves positions 10, 12, 15 to 10, 11, 12
        and sets the length to 13. The leading rows already in place (rows[j] == j)
        are not copied: a chain round (rows = 0, 1, .., m-1) is a zero-copy
        rollback, the length set back and nothing moved.
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


def position_bytes(hparams: HParams, dtype=F32) -> int:
    """Bytes one position takes in a KVCache: a key and a value per KV head in every layer."""
    return 2 * hparams.n_layer * hparams.n_kv_head * hparams.d_head * np.dtype(dtype).itemsize


def memory_available() -> int | None:
    """Bytes this machine can give a process now: /proc/meminfo's MemAvailable (Linux), else its physical
    memory, else None (unknown: nothing is refused on a guess)."""
    try:
        with open("/proc/meminfo", "rb") as f:  # (a file of size 0 that reads a few lines: not safe_io's rule)
            for line in f.read(1 << 16).splitlines():
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_rows_fit(hparams: HParams, n_rows: int, positions: int, what: str, dtype=F32) -> None:
    """ValueError (one sentence saying `what` to lower) when n_rows KV caches of at least `positions` positions
    each cannot fit the memory this machine has free: checked before the first row is made, so a batch far too
    large for the machine is one line, not minutes of work and then an allocation error."""
    positions = min(hparams.n_ctx, positions)
    needed, free = n_rows * positions * position_bytes(hparams, dtype), memory_available()
    if free is not None and needed > free:
        raise ValueError(
            f"{what}: {n_rows:,} rows need at least {needed / 1e9:,.1f} GB for their KV caches ({positions} positions "
            f"of {position_bytes(hparams, dtype):,} bytes each), more than the {free / 1e9:,.1f} GB this machine has "
            "free; decode fewer rows at once"
        )
