"""Growing draft trees: what a drafter proposes when a round may verify a tree.

What this adds over the chains of drafters/__init__.py: two ways of spending a budget of
`nodes` draft tokens on several candidate continuations at once, so that one
target pass (a model's forward with `parents`, model/base.py) can accept the longest path the
target agrees with (verify/ decides which).

    ngram_tree     no model: every earlier occurrence of the text's tail,
                   merged into a trie of what followed, the most frequent
                   continuations kept (SuffixDecoding's idea, Oliaro et al.,
                   arXiv 2411.04975)
    dynamic_tree   a draft model (a smaller GPT-2, or the target's first
                   layers): each layer, the `width` most probable nodes by path
                   confidence each get `width` children (EAGLE-2's dynamic
                   tree, Li et al., arXiv 2406.16858, "expansion phase")

Both return (tokens, parents, q) in the layout of verify/trees.py: nodes listed
parents first, parents[i] = -1 for a child of the text's last token, and q[i]
the distribution tokens[i] was actually drawn from (None under greedy).

NOTE on exactness (see verify.sampled_tree): whether a node is in the
tree may depend on any draft draw made *before* it, never on its own token or
on later draws. EAGLE-2's second phase re-ranks all drafted nodes by
confidence and keeps the best; at temperature > 0 that would keep a drawn
token *because* of its own probability, which biases the output. So sampled
trees here keep every child they draw (they stop drawing when the budget is
spent); only deterministic trees (greedy, the n-gram trie), whose q rows are
point masses, rank nodes freely.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..model.attention import KVCache
from ..model.attention import softmax
from ..model.base import CausalLM
from ..sampling import SamplingParams, point_mass, probabilities
from ..verify import draw_iid, draw_without_replacement, top_k_tokens

SIBLINGS = ("without replacement", "iid")  # how a sampled tree's children of one node are drawn


def continuation(text: np.ndarray, start: int, k: int) -> list[int]:
    """Up to k tokens of `text` from `start`, copying on into its own output past the end (LZ77-style).

    In a loop of period P an occurrence of the tail starts P tokens back, and
    copying on continues the loop for all k tokens instead of stopping after P.

    >>> continuation(np.array([7, 1, 2, 1, 2]), 3, 5)
    [1, 2, 1, 2, 1]
    """
    out: list[int] = []
    for i in range(k):
        j = start + i
        out.append(int(text[j]) if j < len(text) else out[j - len(text)])
    return out


def ngram_tree(ids, depth: int, nodes: int, n_max: int = 3, n_min: int = 1) -> tuple[list[int], list[int]]:
    """A trie of what followed every earlier occurrence of the text's tail, the `nodes` most frequent nodes kept.

    For n from n_max down to n_min, find every earlier occurrence of the last n
    tokens; at the first n that occurs, take the `depth` tokens that followed
    each occurrence and merge them into a trie. Node v's count is how many
    occurrences continue through v, so count(v) / occurrences is the text's own
    estimate of P(path to v | tail) (SuffixDecoding, section 4, scores
    candidates the same way). A child never counts more than its parent, so the
    `nodes` highest counts (ties: shallower, then more recent first) always form
    a connected tree. Siblings come most frequent first, the order they are tested in.

    Returns (tokens, parents), breadth first; ([], []) when the tail never occurred.

    >>> ngram_tree([5, 1, 2, 6, 1, 2, 7, 1, 2, 6, 3, 1, 2], depth=2, nodes=4)
    ([6, 7, 3, 1], [-1, -1, 0, 1])
    """
    text = np.asarray(ids)
    starts: np.ndarray = np.zeros(0, dtype=int)
    for n in range(min(n_max, len(text) - 1), n_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(text[:-1], n)  # [len - n, n], the tail excluded
        starts = np.flatnonzero((windows == text[-n:]).all(axis=1)) + n  # where each continuation starts
        if len(starts):
            break
    if not len(starts) or nodes < 1 or depth < 1:
        return [], []

    # The trie: a node is its path (a tuple of tokens); count and latest occurrence per node.
    count: dict[tuple, int] = {}
    latest: dict[tuple, int] = {}
    for start in starts.tolist():  # increasing, so `latest` ends at the most recent occurrence
        path: tuple = ()
        for token in continuation(text, start, depth):
            path += (token,)
            count[path] = count.get(path, 0) + 1
            latest[path] = start
    kept = sorted(count, key=lambda v: (-count[v], len(v), -latest[v]))[:nodes]
    # Breadth first; siblings in the order of `kept` (most frequent first). Parents precede children in `kept`.
    rank = {v: i for i, v in enumerate(kept)}
    order = sorted(kept, key=lambda v: (len(v), rank[v]))
    index = {v: i for i, v in enumerate(order)}
    return [v[-1] for v in order], [index.get(v[:-1], -1) for v in order]


# step(tokens, parents) -> [len(tokens) + 1, n_vocab] draft logits: row 0 after the
# text's last token, row i + 1 after node i of the tree (tokens, parents) so far.
DraftStep = Callable[[list[int], list[int]], np.ndarray]


def dynamic_tree(
    step: DraftStep,
    depth: int,
    nodes: int,
    width: int,
    params: SamplingParams,
    rng: np.random.Generator,
    siblings: str = "without replacement",
) -> tuple[list[int], list[int], np.ndarray | None]:
    """EAGLE-2's expansion: grow a tree layer by layer from the draft's own confidence.

    Layer 1: the root's `width` children. Each further layer: of the nodes just
    added, the `width` with the highest path confidence (the product of draft
    probabilities along the path, EAGLE-2's estimate of the chance the whole
    path is accepted) each get `width` children, most confident parent first,
    until `nodes` are drafted or the tree is `depth` deep. One draft pass per
    layer (`step` over the tree so far); width 1 is a chain of `depth` tokens.

    Children of a node: at temperature 0, its `width` most likely distinct
    tokens; above it, `width` draws without replacement from the filtered draft
    row, each with the renormalised row it was drawn from as its q (EAGLE);
    siblings="iid": `width` independent draws, each with the row itself as its q
    (duplicates possible; what SpecTr's selection, verify.spectr_tree, needs).

    Returns (tokens, parents, q): q [n, n_vocab] float32, None at temperature 0.
    """
    assert width >= 1 and depth >= 1 and nodes >= 1
    tokens: list[int] = []
    parents: list[int] = []
    q_rows: list[np.ndarray] = []
    confidence: list[float] = []  # per node: product of draft probabilities along its path
    layer = [-1]  # the nodes that may get children next; -1 is the root
    logits = step(tokens, parents)  # [1, n_vocab]
    for level in range(depth):
        grown = []
        ranked = sorted(layer, key=lambda v: -confidence[v] if v >= 0 else -1.0)  # stable: earlier first on ties
        for parent in ranked[:width]:
            room = min(width, nodes - len(tokens))
            if room <= 0:
                break
            row = logits[parent + 1]  # [n_vocab]
            if params.greedy:
                probs = softmax(row)  # only to rank paths; greedy verification never reads q
                kids = top_k_tokens(row, room, floor=-np.inf)
            else:
                probs = probabilities(row[None], params)[0]  # [n_vocab], filtered like the target
                draw_siblings = draw_iid if siblings == "iid" else draw_without_replacement
                kids, rows = draw_siblings(probs, room, rng)
                q_rows.extend(rows)
            for token in kids:
                grown.append(len(tokens))
                tokens.append(token)
                parents.append(parent)
                confidence.append(float(probs[token]) * (confidence[parent] if parent >= 0 else 1.0))
        layer = grown
        if not layer or len(tokens) >= nodes or level == depth - 1:
            break
        logits = step(tokens, parents)  # [n + 1, n_vocab]
    q = None if params.greedy else np.stack(q_rows)
    return tokens, parents, q


def model_tree(
    model: CausalLM,
    cache: KVCache,
    pending: list[int],
    depth: int,
    nodes: int,
    width: int,
    params: SamplingParams,
    rng: np.random.Generator,
    n_layer: int | None = None,
    siblings: str = "without replacement",
) -> tuple[tuple[list[int], list[int], np.ndarray | None], int]:
    """dynamic_tree with a GPT-2 as the draft: returns ((tokens, parents, q), draft passes made).

    pending: the text the cache has not seen yet (at least the text's last
    token); the first pass feeds it and gives the root's row. Each further pass
    runs the whole tree so far after it, with the tree mask (a node already in
    the cache cannot be a parent in a model's forward, so the layer before is fed
    again: a pass over <= `nodes` tokens costs little more than over a few).
    On return the cache holds the text, pending included, and no tree node.
    `n_layer`: draft with the model's first layers only (early exit). `siblings`: as in dynamic_tree.
    """
    calls = 0
    root: np.ndarray | None = None

    def step(tokens: list[int], parents: list[int]) -> np.ndarray:
        nonlocal calls, root
        calls += 1
        if root is None:  # the first pass: catch up on the text, keep it in the cache
            root = model.forward(pending, cache, last_only=True, n_layer=n_layer)  # [1, n_vocab]
            return root
        cache.rollback(text_length)  # drop the previous layer's tree
        rows = model.forward(tokens, cache, n_layer=n_layer, parents=parents)  # [n, n_vocab]
        return np.concatenate([root, rows])  # [n + 1, n_vocab]

    text_length = cache.length + len(pending)
    tree = dynamic_tree(step, depth, nodes, width, params, rng, siblings)
    cache.rollback(text_length)
    return tree, calls


def point_masses(tokens: list[int], n_vocab: int) -> np.ndarray:
    """q rows of a deterministic proposal: a point mass on each token.  [n, n_vocab]"""
    return np.stack([point_mass(t, n_vocab) for t in tokens])
