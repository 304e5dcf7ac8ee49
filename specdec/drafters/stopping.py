"""Drafting fewer tokens where the draft is unsure: a chain cut short by the draft's own confidence.

Why: a draft token earns something only if it is accepted, and it always costs its draft step and
one more row in the verification pass. On a GPU that row is nearly free (r(m) ~ 1); on a CPU a pass
over m tokens costs r(m) steps, r(5) about 1.6 for SmolLM2 on 2 cores (docs/performance.md), so a
chain of K drafts pays for rows that will most likely be thrown away. Cutting the chain where the
draft itself doubts it, and drafting nothing where it doubts the first token, spends passes only on
drafts with a fair chance.

How sure the draft is: EAGLE-2 (Li et al., arXiv 2406.16858, section 3) measured that a draft
head's probability of its token tracks that token's acceptance rate, and that the product along a
path tracks the chance the whole path is accepted; it grows its trees by that product
(trees.dynamic_tree here). Assisted generation in Hugging Face transformers stops a draft when its
probability of the next token falls below a threshold (`assistant_confidence_threshold`, 0.4 by
default); SpecDec++ (Huang et al., arXiv 2405.19715) trains a predictor for the same decision. The
rule here is EAGLE-2's path product with a bar:

    draft position j only if  conf(x_0) * ... * conf(x_(j-1)) * max(q_j)  >=  bar

where conf(x_i) is the draft's probability of the token it drew at position i, and q_j the
distribution position j would be drawn from. Under greedy decoding (which never reads q) the
distribution is the draft's softmax at temperature 1, whose largest entry is the greedy token's.

NOTE: the test reads q_j, never the token drawn from it. A rule that drew x_j first and then kept or
dropped it by conf(x_j) would break exactness at temperature > 0: the kept drafts would no longer
follow q_j, yet the acceptance test divides by q_j. Two tokens a and b, q = p = (1/2, 1/2), and a rule
that drops b: a is drawn and accepted half the time; b is dropped and the target's own token (a or b,
1/2 each) is emitted the other half, so a comes out 3/4 of the time, not 1/2. Deciding from q_j and
the tokens already kept is safe: whatever is decided, position j's token is then either drawn from
q_j and judged against it, or, after the cut, drawn from the target's p_j as the round's last token;
both give p_j exactly (verify/chain.py). Block verification (verify/block.py) stays exact too: its proof
needs the chain's length fixed by the drafts already drawn, which it is. tests/drafters/test_stopping.py runs
the broken rule too.

The bar reads max(q_j), the chance of the likeliest token; at temperature > 0 the chance that the drawn token
is the one that survives is nearer sum(q_j^2), also known before the draw, and would cut more. The bar the
measured costs set (costmodel.confidence_bar, draft_confidence="auto") is a round's first draft's break-even
against plain decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ConfidenceStop:
    """Stop a chain before the position where the draft's path confidence would fall below `bar`.

    EagleDrafter.load(folder, target, stop=ConfidenceStop(0.3))   # or draft_confidence=0.3
    ConfidenceStop(costmodel.confidence_bar(costs.c, costs.r))     # or draft_confidence="auto"
    """

    bar: float  # in (0, 1]: 0 would never stop, and a path confidence never exceeds 1

    def __post_init__(self):
        if isinstance(self.bar, bool) or not isinstance(self.bar, (int, float, np.floating)):
            raise ValueError(
                f"draft_confidence (a bar on the draft's confidence) is a number in (0, 1], not {self.bar!r}"
            )
        if not (math.isfinite(self.bar) and 0 < self.bar <= 1):
            raise ValueError(f"draft_confidence (a bar on the draft's confidence) must lie in (0, 1], got {self.bar}")


class ChainGate:
    """One chain's path confidence under a stop (None: the gate never closes), kept as the chain is drafted;
    every drafter's chain loop reads the rule through it:

        gate = ChainGate(self.stop)
        for each position:  q = ...;  if not gate.opens(logits, q): break;  token = draw...;  gate.drew(token, q)
    """

    def __init__(self, stop: ConfidenceStop | None):
        self.stop, self.path, self.top = stop, 1.0, 1.0  # path: the drawn tokens' probabilities, multiplied

    def opens(self, logits: np.ndarray, q: np.ndarray | None) -> bool:
        """Whether to draft the next position, from its distribution alone, before anything is drawn there:
        the path so far times that distribution's largest probability (top_probability) reaches the bar."""
        if self.stop is None:
            return True
        self.top = top_probability(logits, q)
        return self.path * self.top >= self.stop.bar

    def drew(self, token: int, q: np.ndarray | None) -> None:
        """The position just opened drew `token`: its probability joins the path (greedy's is the top)."""
        if self.stop is not None:
            self.path *= self.top if q is None else float(q[token])


def parse_confidence(text: str) -> float | str:
    """A typed draft confidence: "auto", or a bar in (0, 1] (ValueError naming draft_confidence otherwise)."""
    if text == "auto":
        return text
    try:
        return ConfidenceStop(float(text)).bar
    except ValueError:
        raise ValueError(f"draft_confidence must be a number in (0, 1] or 'auto', got {text!r:.40}") from None


def top_probability(logits: np.ndarray, q: np.ndarray | None) -> float:
    """The largest probability of a draft position's distribution: of q where the token is drawn from it,
    else (greedy decoding) of the draft's softmax of `logits` ([n] floats) at temperature 1."""
    if q is not None:
        return float(q.max())
    return float(1 / np.exp(logits - logits.max(), dtype=np.float64).sum())
