"""The two interfaces the speculative sampler is written against.

    Drafter   proposes tokens (a chain, or a tree of candidates) with the
              distribution q each was drawn from; drafters/ has them all.
    KPolicy   decides how many tokens to draft each round; costmodel/chain.py has three.

And the drafter's answer, a Proposal. The sampler (speculative.py) knows nothing
else about a drafter: whatever proposes (a smaller model, a lookup in the text,
the target's own first layers, heads reading the target's hidden states), the
round reads the same.

Shape notation: n = drafted tokens, n_vocab = vocabulary size, m = positions the
target just wrote into its cache for good, n_embd = the target's width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .model.base import CausalLM
    from .model.attention import KVCache
    from .sampling import SamplingParams


@dataclass
class Proposal:
    """What a drafter proposes: n tokens, each with its parent, and the q they were drawn from.

    tokens[i] follows tokens[parents[i]], or the last token of the text when
    parents[i] == -1; a parent always comes before its children. A chain, the
    papers' case, has parents [-1, 0, 1, ..., n-2]; anything else is a tree.

    q[i] ([n_vocab], float32) is the distribution tokens[i] was ACTUALLY drawn
    from, given its path and its earlier siblings. The acceptance test reads
    exactly these rows, so they must be the drawing distributions, not some
    other estimate of them. None under greedy decoding (which never reads q).

        Proposal.chain([464, 3290]).parents             # [-1, 0]
        Proposal([5, 6, 7], [-1, -1, 0]).pass_parents()  # [-1, 0, 0, 1]: the pass's row 0 is the text's last token
    """

    tokens: list[int]  # [n] drafted token ids, parents before children
    parents: list[int]  # [n] index of each token's parent in `tokens`; -1 = follows the text's last token
    q: np.ndarray | None = None  # [n, n_vocab] float32, or None under greedy decoding

    def __post_init__(self):
        n = len(self.tokens)
        assert len(self.parents) == n, f"{n} tokens but {len(self.parents)} parents"
        assert all(-1 <= p < i for i, p in enumerate(self.parents)), f"parents must come first: {self.parents}"
        assert self.q is None or self.q.shape[0] == n, f"q has {self.q.shape[0]} rows for {n} tokens"

    @classmethod
    def chain(cls, tokens: list[int], q: np.ndarray | None = None) -> "Proposal":
        """A chain: each token follows the one before it."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q)

    @property
    def is_chain(self) -> bool:
        return list(self.parents) == list(range(-1, len(self.tokens) - 1))

    def __len__(self) -> int:
        return len(self.tokens)

    def pass_parents(self) -> list[int] | None:
        """`parents` for the verification pass over [ids[-1], *tokens] (node i at row i + 1); None for a chain."""
        return None if self.is_chain else [-1, *(p + 1 for p in self.parents)]

    @property
    def depth(self) -> int:
        """Tokens on the longest root-to-leaf path (len(tokens) for a chain)."""
        depths: list[int] = []
        for p in self.parents:
            depths.append(depths[p] + 1 if p >= 0 else 1)
        return max(depths, default=0)

    def ends_at_leaf(self, path: list[int]) -> bool:
        """Whether an accepted path ends at a node with no children (then the target's token after it is a bonus;
        otherwise the last node's children were all tested and rejected). For a chain: all drafts accepted."""
        return (path[-1] if path else -1) not in self.parents


@runtime_checkable
class Drafter(Protocol):
    """Anything that proposes tokens for the target to verify.

    The sampler calls, for one run:
        begin(target, cache, prompt)      once, before anything else
        commit(prompt, features)          after the prompt's prefill pass (when the prompt has 2+ tokens)
        then every round:
        propose(ids, k, params, rng)      -> Proposal
        commit(ids, features)             after the verification pass

    Example (a drafter that always proposes the token after the last one, mod n_vocab):

        class Next:
            n_vocab, n_ctx, calls = 50257, None, 0
            def begin(self, target, cache, prompt): pass
            def propose(self, ids, k, params, rng, nodes=None):
                tokens = [(ids[-1] + 1 + i) % self.n_vocab for i in range(k)]
                q = None if params.greedy else np.stack([point_mass(t, self.n_vocab) for t in tokens])
                return Proposal.chain(tokens, q)
            def commit(self, ids, features): pass

        speculative_sample(target, Next(), ids, 20)
    """

    n_vocab: int  # must equal the target's
    n_ctx: int | None  # the longest text the drafter can handle, None for no limit
    calls: int  # draft forward passes so far (0 for a drafter without a model)

    def begin(self, target: CausalLM, cache: KVCache, prompt: list[int]) -> None:
        """A new run: the target, the target's KV cache for this run (empty now; a
        drafter may write into it, as early exit does, if it sets the length back),
        and the prompt. Reset all per-run state here."""

    def propose(
        self, ids: list[int], k: int, params: SamplingParams, rng: np.random.Generator, nodes: int | None = None
    ) -> Proposal:
        """Propose what follows `ids` (the whole text so far; ids[-1] is in no cache yet).

        A chain of at most k tokens when nodes is None; otherwise a tree of at most
        `nodes` tokens and depth at most k (a drafter that cannot branch returns a
        chain). Fewer, or none, is fine: the round then emits the target's token."""

    def commit(self, ids: list[int], features: np.ndarray) -> None:
        """After every target pass: ids is the whole text now; features [m, n_embd]
        are the target's hidden states (after ln_f) at the m positions just written
        for good into its cache; the last row is the one whose logits gave ids[-1].
        Roll back or store state here. (A drafter with a `hidden_layers` list gets
        those layers' states side by side instead, [m, len(hidden_layers) * n_embd]:
        see `features_asked`.)"""


@runtime_checkable
class KPolicy(Protocol):
    """How many tokens to draft each round."""

    k_max: int  # the most next_k() will ever return (sizes the acceptance histogram)

    def next_k(self) -> int:
        """Drafts to ask for in the coming round (the sampler may ask for fewer near the end)."""

    def update(self, k: int, n_accepted: int) -> None:
        """What happened in a round that drafted k > 0 tokens: n_accepted of them were accepted."""


def priced_drafter(drafter):
    """The drafter whose step prices a round's drafts (measure_costs times it, the tree cost model counts its
    weights): the drafter itself, or the one it names in its optional `priced` attribute (LookupFirst: its
    second drafter, since a looked-up draft costs no pass)."""
    return getattr(drafter, "priced", None) or drafter


def features_asked(drafter) -> bool | list[int]:
    """What the round asks the target's pass for, as model.forward's return_hidden: the final hidden
    state (True), or the layers a drafter lists in its optional `hidden_layers` (EAGLE-3's heads)."""
    return getattr(drafter, "hidden_layers", None) or True
