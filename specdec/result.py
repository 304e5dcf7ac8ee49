"""What a sampler returns: the new tokens and what producing them cost.

Both samplers fill the same record; everything past the raw counters is
derived from the per-round record (k drafted, n accepted), so the numbers
cannot disagree with each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

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

    def add_round(self, k: int, n_accepted: int) -> None:
        """Record a speculative round that proposed k drafts and accepted n_accepted of them."""
        self.k_per_round.append(k)
        self.accepted_per_round.append(n_accepted)

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
        accepted / drafts actually judged (see costmodel.drafts_judged)."""
        judged = sum(drafts_judged(k, n) for k, n in zip(self.k_per_round, self.accepted_per_round) if k > 0)
        return self.accepted / judged if judged else math.nan

    @property
    def mean_k(self) -> float:
        """Drafts proposed per round, over rounds that drafted at all (0 if none did)."""
        drafting = [k for k in self.k_per_round if k > 0]
        return sum(drafting) / len(drafting) if drafting else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return len(self.tokens) / self.target_calls if self.target_calls else math.nan
