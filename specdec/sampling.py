"""From logits to tokens: temperature, top-k, top-p, greedy, and one random draw.

Both samplers (autoregressive.py, speculative.py) and every drafter go through
these few functions, so the target and the draft are always filtered the same
way. Turning logits into probabilities is kept apart from drawing a token,
because speculative sampling needs the probabilities themselves.

`probabilities` gives filtered tokens probability exactly 0, and every row sums
to 1. It shifts the logits by their max before dividing by the temperature: the
largest is then exactly 0, and a tiny temperature can only push the others
towards -inf, never to nan.

`draw` inverts the cumulative sum, taken in float64 so that rounding cannot shift
mass between tokens: a token with probability 0 can never be drawn.

`check_finite_logits`: loading refuses non-finite weights, but a model built in
memory (or weights so large that float32 overflows) can still produce NaN or
infinite logits; without the check greedy decoding emits token 0 forever and
sampling fails deep inside. It costs one pass over n_vocab floats per call.

    p = probabilities(model.forward(ids, model.new_cache()), SamplingParams(0.8, top_p=0.95))  # [n_seq, n_vocab]
    token = draw(p[-1], np.random.default_rng(0))
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How a distribution is shaped before drawing from it.

    temperature 0 means greedy decoding (argmax), a separate branch rather than
    a division by a tiny number. top_k keeps the k most likely tokens (ties at
    the k-th logit are all kept); top_p keeps the smallest set of most likely
    tokens whose probabilities sum to at least top_p. Both act after the
    temperature, in the order transformers applies them.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """[n_rows, n_vocab] logits -> [n_rows, n_vocab] float32 probabilities, temperature, top-k and top-p applied."""
    assert not params.greedy, "greedy decoding takes the argmax of the logits, not probabilities"
    with np.errstate(over="ignore"):
        z = (logits - logits.max(axis=-1, keepdims=True)) / np.float32(params.temperature)  # [n_rows, n_vocab]
    if params.top_k is not None and params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k, axis=-1)[:, -params.top_k, None]  # [n_rows, 1]
        z = np.where(z < kth, np.float32(-np.inf), z)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if params.top_p is not None and params.top_p < 1:
        p = _top_p(p, params.top_p)
    return p


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Zero all but the smallest head of each row whose mass reaches top_p; renormalise.

    Ranking tokens by probability, keep the first j, where j is the first rank at
    which the kept mass reaches top_p. Only the *values* need sorting (about
    0.1 ms a row, against 3.5 ms for a stable argsort of 50257 ids): the j-th
    largest value v decides; every token above v is kept, and of the tokens
    equal to v the lowest ids fill the remaining places, as a stable sort would.
    """
    descending = np.sort(p, axis=-1)[:, ::-1]  # [n_rows, n_vocab]
    mass_before = np.cumsum(descending, axis=-1) - descending  # mass ranked above each
    n_keep = np.count_nonzero(mass_before < np.float32(top_p), axis=-1)  # [n_rows]; the first is always kept
    out = np.zeros_like(p)
    for row, (probs, j) in enumerate(zip(p, n_keep)):
        v = descending[row, j - 1]  # the smallest probability kept
        keep = probs > v
        ties = np.flatnonzero(probs == v)[: j - np.count_nonzero(keep)]
        keep[ties] = True
        out[row, keep] = probs[keep] / probs[keep].sum()
    return out


def greedy(logits: np.ndarray) -> int:
    """The most likely token of one [n_vocab] row (lowest id on ties): greedy(logits[-1])."""
    return int(np.argmax(logits))


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a [n_vocab] probability row, by inverting its cumulative sum (in float64)."""
    cdf = np.cumsum(p, dtype=np.float64)
    token = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    assert token < len(p), "probabilities must be finite and sum to more than 0"
    return token


def point_mass(token: int, n_vocab: int) -> np.ndarray:
    """The distribution of a deterministic proposal: all probability on `token`."""
    q = np.zeros(n_vocab, dtype=np.float32)
    q[token] = 1
    return q


def check_finite_logits(logits: np.ndarray, model_name: str) -> np.ndarray:
    """`logits` unchanged, or a ValueError naming the model if any is NaN or infinite (the module docstring)."""
    if not np.isfinite(logits).all():
        raise ValueError(
            f"model {model_name} produced NaN or infinite logits: its weights or config.json are broken "
            f"(or its activations overflow float32); reload it from a good checkpoint"
        )
    return logits
