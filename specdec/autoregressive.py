"""Plain autoregressive sampling: one target forward pass per new token.

The baseline speculative decoding is measured against, and the reference its
output distribution must equal. Also home to what both samplers share: the
result record with its call counters, and the checks on a request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .costmodel import drafts_judged
from .gpt2 import GPT2
from .sampling import SamplingParams, draw, greedy, probabilities

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


def check_request(model: GPT2, prompt_ids, n_tokens: int) -> list[int]:
    """Validate a prompt and length against a model; return the prompt as a list of ints."""
    prompt = [int(t) for t in np.asarray(prompt_ids, dtype=np.int64).reshape(-1)]
    if not prompt:
        raise ValueError(
            "the prompt is empty: GPT-2 needs at least one token to condition on; to start "
            "from nothing pass [tokenizer.eot_token] (<|endoftext|>, id 50256), as GPT-2 was trained"
        )
    if min(prompt) < 0 or max(prompt) >= model.n_vocab:
        raise ValueError(f"prompt token ids must lie in 0..{model.n_vocab - 1}")
    if not isinstance(n_tokens, (int, np.integer)) or n_tokens < 0:
        raise ValueError(f"n_tokens must be a non-negative integer, got {n_tokens!r}")
    if len(prompt) + n_tokens > model.n_ctx:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + n_tokens ({n_tokens}) exceeds the context window "
            f"of {model.n_ctx}: shorten the prompt or ask for at most {max(0, model.n_ctx - len(prompt))} tokens"
        )
    return prompt


def make_rng(seed: int | None, rng: np.random.Generator | None) -> np.random.Generator:
    if seed is not None and rng is not None:
        raise ValueError("pass either seed or rng, not both")
    return rng if rng is not None else np.random.default_rng(seed)


def autoregressive_sample(
    model: GPT2,
    prompt_ids,
    n_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
    on_token: TokenCallback | None = None,
) -> DecodeResult:
    """Generate n_tokens after prompt_ids, one forward pass each.

    The first pass reads the whole prompt into the KV cache; each later pass
    feeds only the previous token. Temperature 0 is greedy decoding.
    """
    params = SamplingParams(temperature, top_k, top_p)
    prompt = check_request(model, prompt_ids, n_tokens)
    rng = make_rng(seed, rng)
    result = DecodeResult()
    cache = model.new_cache()
    new = prompt
    for _ in range(n_tokens):
        logits = model.forward(new, cache, last_only=True)[0]  # [n_vocab]: the next position
        result.target_calls += 1
        if params.greedy:
            token = greedy(logits)
        else:
            token = draw(probabilities(logits[None], params)[0], rng)
        result.tokens.append(token)
        if on_token:
            on_token(token, "target")
        new = [token]
    return result
