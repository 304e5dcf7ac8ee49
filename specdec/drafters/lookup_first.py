"""Prompt lookup first, a drafter that reads the model where the lookup finds nothing.

Why: the two kinds of draft are good at different text. Prompt lookup (NgramDrafter) is free and, where
the reply repeats itself or the prompt, often right for several tokens in a row; elsewhere it proposes
nothing. A trained head (EAGLE) or a draft model proposes everywhere, but each draft costs a step and is
right less often. On SmolLM2's chat replies at temperature 0 (docs/smollm2.md) prompt lookup keeps about
half of its drafts (alpha 0.51), the EAGLE head drafting 4 a round about four in ten (0.38), and together,
with the head's chains cut by its confidence, they keep 0.65 and beat either alone. Cascade Speculative
Drafting (Chen et al., arXiv 2312.11462) puts a statistical lookup below its smallest draft model in the
same spirit; this is its simplest form: per round, not per position.

The rule, each round:

    lookup = the tokens that followed the latest earlier occurrence of the text's last 3 tokens, else of its
             last 2 (NgramDrafter.lookup with n_min = SHORTEST_MATCH)
    propose lookup's chain (or trie) if it found one, else whatever the second drafter proposes

A lone matching token is weak evidence: on the suite's chat replies at temperature 0, lookup-first with
1-token matches allowed was slower than with matches of 2 or more (1.11x against 1.18x over plain decoding,
docs/smollm2.md), as the head drafts better than a copy after a common token.

Exactness: which drafter proposes is decided from the text so far alone, before anything is drawn in this
round, so for every position the sampler sees a draft drawn from the q it is given (a point mass for a
looked-up token, the model's q for a model's draft) and judges it against the target's p as it would for
either drafter alone; each position's output is then p exactly (verify/chain.py). The second drafter
still reads every target pass (commit), so an EAGLE head keeps its features current through lookup rounds.

A confidence bar (draft_confidence) cuts the second drafter's chains only: a looked-up token is certain,
and its confidence is always 1. The bar "auto" and K "auto" are priced by the second drafter's step
(`priced`, read by timing.measure_costs), the step a round pays when the lookup finds nothing.

The first drafter may be any model-free drafter that proposes nothing where it has nothing good:
suffix decoding ("suffix+eagle", suffix.SuffixDrafter) decides that by expected gain each round, from
the text so far and its own record, and so is as exact a first drafter as the lookup.
"""

from __future__ import annotations

from ..interfaces import Drafter, Proposal

SHORTEST_MATCH = 2  # "ngram+X" looks up suffixes of 2..N tokens (N >= 2); where none matches, X drafts
THEN_K = 4  # the most the second drafter drafts a round after a self-sizing lookup (suffix+X), whose K is up to 32


class LookupFirst:
    """A model-free lookup where it proposes (prompt lookup where the text's tail has occurred before, or
    suffix decoding where it expects a gain), `then` (a model, early exit, Medusa or EAGLE heads) everywhere
    else. Both see every pass; each round asks the lookup first.

        LookupFirst(NgramDrafter(target.n_vocab, 3, SHORTEST_MATCH), EagleDrafter.load(folder, target))
        # what draft="ngram+eagle:FOLDER" builds; with a bar: EagleDrafter.load(..., stop=ConfidenceStop(P))
        LookupFirst(SuffixDrafter(target.n_vocab), EagleDrafter.load(folder, target))   # "suffix+eagle:FOLDER"
    """

    def __init__(self, lookup, then: Drafter, then_k: int | None = None):
        if lookup.n_vocab != then.n_vocab:
            raise ValueError(
                f"the lookup has {lookup.n_vocab} tokens and the drafter after it {then.n_vocab}: "
                "both must have the target's vocabulary"
            )
        self.lookup, self.then = lookup, then
        # the second drafter's most a round, below K (suffix+X: the lookup sizes itself up to 32, X drafts 4)
        self.then_k = then_k if then_k is not None else THEN_K if hasattr(lookup, "k_default") else None
        self.n_vocab = then.n_vocab
        self.n_ctx = then.n_ctx
        self.looked_up = 0  # rounds the lookup proposed (the rest were the second drafter's)

    @property
    def calls(self) -> int:
        return self.lookup.calls + self.then.calls  # the lookup makes no passes: the second drafter's

    @property
    def priced(self) -> Drafter:
        return self.then  # the step a round pays where the lookup finds nothing (interfaces.priced_drafter)

    @property
    def stop(self):
        return getattr(self.then, "stop", None)

    @stop.setter
    def stop(self, stop) -> None:  # a bar cuts the second drafter's chains (speculative_sample sets "auto")
        self.then.stop = stop

    @property
    def k_default(self) -> int:
        """A run's K when none is given: the lookup's (suffix decoding sizes its own rounds), else 4."""
        return getattr(self.lookup, "k_default", 4)

    @property
    def r(self):
        """The target's r(m), where the lookup sizes its rounds by it (suffix decoding: config.setup sets it)."""
        return self.lookup.r  # AttributeError for prompt lookup: hasattr(drafter, "r") is then False

    @r.setter
    def r(self, r) -> None:
        self.lookup.r = r

    @property
    def hidden_layers(self):
        return getattr(self.then, "hidden_layers", None)  # what the second drafter reads (EAGLE-3's layers)

    def fresh(self) -> LookupFirst:
        """A drafter for another sequence (a batch gives each row one): a fresh lookup and second drafter."""
        if not hasattr(self.then, "fresh"):
            raise ValueError(
                f"a batch gives each row its own drafter, and {type(self.then).__name__} has no "
                "per-row copy: use ngram+eagle or ngram+medusa:DIR with --batch"
            )
        return LookupFirst(self.lookup.fresh(), self.then.fresh(), self.then_k)

    def begin(self, target, cache, prompt) -> None:
        self.lookup.begin(target, cache, prompt)
        self.then.begin(target, cache, prompt)

    def propose(self, ids, k, params, rng, nodes=None) -> Proposal:
        found = self.lookup.propose(ids, k, params, rng, nodes)  # decided by the text alone: nothing drawn yet
        if len(found):
            self.looked_up += 1
            return found
        k_then = k if self.then_k is None else min(k, self.then_k)
        return self.then.propose(ids, k_then, params, rng, nodes)

    def commit(self, ids, features) -> None:
        self.lookup.commit(ids, features)
        self.then.commit(ids, features)
