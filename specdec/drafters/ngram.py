"""Prompt lookup (Saxena's prompt lookup decoding; transformers' prompt_lookup_num_tokens): drafting with no model.

Where the last few tokens of the text occurred before, what followed them then is a
good guess for what follows now: the text repeats itself (a request quoted in the
reply, a name, a loop of code). The guess is deterministic, so its q is a point mass;
a tree (`nodes`) holds every earlier occurrence as a trie (trees.ngram_tree).

Layer: as drafters/__init__.py.
"""

from __future__ import annotations

import numpy as np

from ..interfaces import Proposal
from ..model.attention import KVCache
from ..model.base import CausalLM
from .trees import ngram_tree, point_masses


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier match of the text's tail.

    For n from `n_max` down to `n_min`, look for the last n tokens of the text
    earlier in the text; at the most recent match, propose the (up to k) tokens
    that followed it. No match: no proposal, and the round is a plain target step.

    The proposal is deterministic, so its distribution q is a point mass on the
    proposed token x. Leviathan et al.'s rule then reads:
        accept x with probability min(1, p(x) / q(x)) = min(1, p(x) / 1) = p(x)
        on rejection draw from norm(max(0, p - q)):
            for y != x: max(0, p(y) - 0) = p(y);  for x: max(0, p(x) - 1) = 0
        i.e. from p with x removed, renormalised by 1 - p(x).
    The output is still exactly p: P(x) = p(x) (accepted), and for y != x,
    P(y) = (1 - p(x)) * p(y) / (1 - p(x)) = p(y). The same general code in
    verify/ handles it, with q given as one-hot rows.
    """

    def __init__(self, n_vocab: int, n_max: int = 3, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_vocab = n_vocab
        self.n_max, self.n_min = n_max, n_min
        self.n_ctx = None  # no context limit of its own
        self.calls = 0

    def lookup(self, ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the tail of ids.

        The copy may run past the end of the text into its own output, as in
        LZ77: in a loop of period P the latest match starts P tokens back, and
        copying on continues the loop for all k tokens instead of stopping after P.

        >>> NgramDrafter(10).lookup([7, 1, 2, 1, 2], 5)  # tail [1, 2] last seen at 1, period 2
        [1, 2, 1, 2, 1]
        """
        text = np.asarray(ids)
        for n in range(min(self.n_max, len(ids) - 1), self.n_min - 1, -1):
            tail = text[-n:]
            # Windows starting at 0 .. len-n-1 (the tail itself excluded).
            windows = np.lib.stride_tricks.sliding_window_view(text[:-1], n)  # [len-n, n]
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                follow = int(hits[-1]) + n  # the token after the most recent match
                out: list[int] = []
                for i in range(k):
                    j = follow + i
                    out.append(int(text[j]) if j < len(text) else out[j - len(text)])
                return out
        return []

    def fresh(self) -> NgramDrafter:
        """A drafter for another sequence (a batch gives each row one): the same n-gram sizes."""
        return NgramDrafter(self.n_vocab, self.n_max, self.n_min)

    def begin(self, target: CausalLM, cache: KVCache, prompt: list[int]) -> None:
        pass  # stateless: the text itself is the table

    def propose(self, ids, k, params, rng, nodes=None) -> Proposal:
        # A chain: the latest occurrence; a tree: a trie of them all. Either is deterministic,
        # so q is a point mass on each token (see above).
        if nodes is None:
            tokens, parents = self.lookup(ids, k), None
        else:
            tokens, parents = ngram_tree(ids, k, nodes, self.n_max, self.n_min)
        q = None if params.greedy or not tokens else point_masses(tokens, self.n_vocab)
        return Proposal.chain(tokens, q) if parents is None else Proposal(tokens, parents, q)

    def commit(self, ids, features) -> None:
        pass
