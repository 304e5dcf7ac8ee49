"""What a sampler returns: the new tokens and what producing them cost.

Both samplers fill the same record; everything past the raw counters is
derived from the per-round record (k drafted, n accepted), so the numbers
cannot disagree with each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import display
from .costmodel import drafts_judged

# on_token(token, kind) is called once per emitted token, in order. kind is
# "target" (sampled from the target: every token here, and speculative
# decoding's corrected tokens), "draft" (an accepted draft token) or "bonus"
# (the extra target token after a round whose drafts were all accepted).
TokenCallback = Callable[[int, str], None]


@dataclass
class DecodeResult:
    """New tokens and what producing them cost, for either sampler."""

    tokens: list[int] = field(default_factory=list)  # the new token ids, prompt excluded
    target_calls: int = 0  # target forward passes, the prompt's prefill included
    draft_calls: int = 0  # draft forward passes (0 without a draft model)
    k_per_round: list[int] = field(default_factory=list)  # drafts proposed in each speculative round
    accepted_per_round: list[int] = field(default_factory=list)  # of which accepted
    k_max: int = 0  # the most drafts a round could ask for (sizes the histogram)
    tokenizer: object = field(default=None, repr=False, compare=False)  # the target's, for .text (None: unknown)

    judged_per_round: list[int] = field(default_factory=list)  # depths tested per round (empty: chains, derived)

    def add_round(self, k: int, n_accepted: int, judged: int) -> None:
        """Record a speculative round that proposed k drafts (chain or tree) and accepted n_accepted of them.

        judged: depths at which candidates were tested: n_accepted, plus one when
        the candidates below the last accepted node were all rejected (a tree's
        path can also end at a leaf).
        """
        self.k_per_round.append(k)
        self.accepted_per_round.append(n_accepted)
        self.judged_per_round.append(judged)

    # Everything below is derived from the per-round record above.

    @property
    def rounds(self) -> int:
        """Speculative rounds (drafting, then one verification pass each)."""
        return len(self.k_per_round)

    @property
    def drafted(self) -> int:
        return sum(self.k_per_round)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_round)

    @property
    def accepted_histogram(self) -> list[int]:
        """[n] = rounds that drafted and accepted n of their drafts, n = 0..k_max ([] without drafting)."""
        histogram = [0] * (self.k_max + 1) if self.k_max else []
        for k, n in zip(self.k_per_round, self.accepted_per_round):
            if k > 0:
                histogram[n] += 1
        return histogram

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (nan when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def alpha(self) -> float:
        """Estimated chance that one draft token is accepted (the paper's alpha):
        accepted / drafts actually judged (see costmodel.drafts_judged). For a tree: the
        chance that some candidate at a depth the path reached is accepted."""
        judged = sum(self.judged)
        return self.accepted / judged if judged else math.nan

    @property
    def judged(self) -> list[int]:
        """Per round, the depths at which candidates were tested (add_round's `judged`); for a
        record without them (chains), costmodel.drafts_judged of each round's k and n."""
        if len(self.judged_per_round) == self.rounds:
            return list(self.judged_per_round)
        return [drafts_judged(k, n) for k, n in zip(self.k_per_round, self.accepted_per_round)]

    @property
    def mean_k(self) -> float:
        """Drafts proposed per round, over rounds that drafted at all (0 if none did)."""
        drafting = [k for k in self.k_per_round if k > 0]
        return sum(drafting) / len(drafting) if drafting else 0.0

    @property
    def draft_steps(self) -> int:
        """Draft steps to price with c: the draft's forward passes, or for a model-free drafter
        (n-gram lookup: no passes) one lookup per round, which is what its c is measured on."""
        return self.draft_calls if self.draft_calls else self.rounds

    @property
    def tokens_per_target_call(self) -> float:
        return len(self.tokens) / self.target_calls if self.target_calls else math.nan

    @property
    def tau(self) -> float:
        """Tokens per speculative round (accepted drafts + the one target token); 1 for plain decoding's steps."""
        return len(self.tokens) / self.rounds if self.rounds else math.nan

    @property
    def acceptance_by_position(self) -> list[float]:
        """[i-1] = P(draft i accepted | drafts 1..i-1 accepted), i = 1..K (nan where never judged).
        For trees: P(some candidate at depth i accepted | the path reached depth i - 1)."""
        # A round judged depths 1..judged: acceptance_by_position with k = judged counts exactly those.
        return acceptance_by_position(self.judged, self.accepted_per_round, self.k_max)[0].tolist()

    @property
    def kinds(self) -> list[str]:
        """How each token was produced: "draft", "target" or "bonus" (as on_token was told).

        A round that accepted n of its k drafts emitted n "draft" tokens, then one
        "bonus" if its path ended at a leaf (judged == n: for a chain, n == k) and
        k > 0, else one "target" token; without rounds (plain decoding) every
        token is the target's.
        """
        if not self.rounds:
            return ["target"] * len(self.tokens)
        kinds = []
        for k, n, judged in zip(self.k_per_round, self.accepted_per_round, self.judged):
            kinds += ["draft"] * n + ["bonus" if judged == n and k > 0 else "target"]
        return kinds

    @property
    def text(self) -> str | None:
        """The new tokens decoded, when the model that made them has a tokenizer."""
        return None if self.tokenizer is None else self.tokenizer.decode(self.tokens)

    def to_dict(self) -> dict:
        """Plain values (lists, ints, floats, str) for JSON or pandas: pd.DataFrame([r.to_dict() for r in runs])."""
        return {
            "tokens": list(self.tokens), "text": self.text, "kinds": self.kinds,
            "target_calls": self.target_calls, "draft_calls": self.draft_calls, "rounds": self.rounds,
            "drafted": self.drafted, "accepted": self.accepted, "acceptance_rate": self.acceptance_rate,
            "alpha": self.alpha, "tau": self.tau, "acceptance_by_position": self.acceptance_by_position,
            "accepted_histogram": self.accepted_histogram, "k_per_round": list(self.k_per_round),
            "accepted_per_round": list(self.accepted_per_round), "mean_k": self.mean_k,
            "tokens_per_target_call": self.tokens_per_target_call,
        }  # fmt: skip

    def __repr__(self) -> str:
        return display.result_repr(self)

    def __str__(self) -> str:
        return display.result_summary(self)

    def _repr_html_(self) -> str:
        """What a notebook shows: the summary, then the text with each token coloured by its kind."""
        return display.result_html(self)


def acceptance_by_position(k_per_round, accepted_per_round, k_max: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per draft position i = 1..max k: (acceptance rate, rounds that judged position i).

    A round that proposed k drafts and accepted n judged positions 1..min(n+1, k):
    drafts after the first rejection are never judged. The rate at i is
    P(draft i accepted | drafts 1..i-1 accepted); under the papers' i.i.d.
    assumption it is alpha at every i. Positions never judged get nan.

    >>> rate, judged = acceptance_by_position([3, 3, 3], [3, 1, 0])
    >>> rate.tolist(), judged.tolist()
    ([0.6666666666666666, 0.5, 1.0], [3, 2, 1])
    """
    k_max = max(k_max, *k_per_round, 0)  # positions 1..k_max, at least the longest round
    judged = np.zeros(k_max, dtype=np.int64)
    accepted = np.zeros(k_max, dtype=np.int64)
    for k, n in zip(k_per_round, accepted_per_round):
        assert 0 <= n <= k, f"a round cannot accept {n} of {k} drafts"
        judged[: min(n + 1, k)] += 1
        accepted[:n] += 1
    rate = np.full(k_max, np.nan)
    np.divide(accepted, judged, out=rate, where=judged > 0)
    return rate, judged
