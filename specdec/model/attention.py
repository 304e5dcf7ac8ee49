"""Attention, shared by every architecture in model/: softmax, masked attention, and the tree mask.

Shape notation as in gpt2.py (n_seq new tokens, n_kv = n_past + n_seq positions,
n_head heads of width d_head). Each architecture builds q, k and v its own way
(GPT-2 from one fused product; Llama with rotary positions and grouped key/value
heads) and then calls `attention` here; which new tokens may see which is a
chain's causal mask or a tree's `tree_mask`, laid out per sequence by packing.py.
"""

from __future__ import annotations

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
