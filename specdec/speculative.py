"""Speculative sampling: a drafter proposes K tokens, the target verifies them in
one forward pass, and rejection sampling keeps the output exactly the target's.

What it adds over autoregressive.py: the draft/verify/accept round below. It
follows Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding" (arXiv 2211.17192), Algorithm 1, and is the same algorithm as Chen et
al., "Accelerating Large Language Model Decoding with Speculative Sampling"
(arXiv 2302.01318), Algorithm 2.

NOTE on letters: the two papers swap them. Here, as in Leviathan et al.,
    p = the TARGET model's distribution (the one we must reproduce exactly)
    q = the DRAFT's distribution (the cheap guess)
Chen et al. write q for the target and p for the draft.

One round, with the text so far ending in a token t that no cache has seen yet:
  1. Draft: the drafter proposes x_0 .. x_(k-1), drawing x_i from q_i.
  2. Verify: one target forward over [t, x_0, .., x_(k-1)] gives k+1 rows:
     row i is p_i, the target's distribution for the position of x_i, and row k
     is the distribution for the token after x_(k-1).
  3. Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), in order, and
     stop at the first rejection.
  4. At a rejection at i, emit one token from norm(max(0, p_i - q_i)); if all
     k were accepted, emit a bonus token from p_k.
So every round emits between 1 and k+1 tokens for a single target pass.

Why the output is exactly p: for any token y at position i,
    P(emit y) = q(y) min(1, p(y)/q(y)) + P(reject) * norm(max(0, p - q))(y)
              = min(q(y), p(y)) + (1 - sum_x min(p(x), q(x))) * max(0, p(y) - q(y)) / sum_x max(0, p(x) - q(x))
and since sum_x max(0, p - q) = 1 - sum_x min(p, q), the second term is
max(0, p(y) - q(y)); min(q, p) + max(0, p - q) = p(y). (Leviathan et al.,
Appendix A.1; Chen et al., Theorem 1.)
"""

from __future__ import annotations

import numpy as np

from .autoregressive import DecodeResult, TokenCallback, check_request, make_rng
from .drafters import make_drafter
from .gpt2 import GPT2
from .sampling import SamplingParams, draw, greedy, probabilities


class AdaptiveK:
    """Grow K by one after a round whose drafts were all accepted; shrink it by one
    after a rejection; always within [k_min, k_max]. A simple heuristic: long
    runs of agreement (repetitive text, an easy stretch) earn longer drafts.
    """

    def __init__(self, k_start: int = 4, k_min: int = 1, k_max: int = 8):
        if not 1 <= k_min <= k_start <= k_max:
            raise ValueError(f"adaptive K needs 1 <= k_min <= K <= k_max, got {k_min}, {k_start}, {k_max}")
        self.k, self.k_min, self.k_max = k_start, k_min, k_max

    def next_k(self) -> int:
        return self.k

    def update(self, k: int, n_accepted: int) -> None:
        if n_accepted == k:
            self.k = min(self.k_max, self.k + 1)
        else:
            self.k = max(self.k_min, self.k - 1)


class FixedK:
    def __init__(self, k: int):
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"K (draft tokens per round) must be an integer >= 1, got {k!r}")
        self.k = self.k_max = int(k)

    def next_k(self) -> int:
        return self.k

    def update(self, k: int, n_accepted: int) -> None:
        pass


def speculative_sample(
    target: GPT2,
    draft,
    prompt_ids,
    n_tokens: int,
    K=4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
    on_token: TokenCallback | None = None,
) -> DecodeResult:
    """Generate n_tokens after prompt_ids with speculative sampling.

    draft: a smaller GPT2 of the same vocabulary, "ngram" / "ngram:N" (prompt
    lookup), "early_exit:L" (the target's first L layers), or a drafter object
    (see drafters.py). K: draft tokens per round, an int, or a policy with
    next_k() / update(k, n_accepted) / k_max such as AdaptiveK.

    At temperature 0 the result equals autoregressive_sample's greedy tokens;
    above it, its distribution equals autoregressive sampling's.
    """
    params = SamplingParams(temperature, top_k, top_p)
    k_policy = K if hasattr(K, "next_k") else FixedK(K)
    prompt = check_request(target, prompt_ids, n_tokens)
    drafter = make_drafter(draft, target)
    if drafter.n_vocab != target.n_vocab:
        raise ValueError(
            f"draft and target must share a vocabulary: the draft has {drafter.n_vocab} tokens, "
            f"the target {target.n_vocab}; pick a draft from the target's family (GPT-2 models all have 50257)"
        )
    rng = make_rng(seed, rng)
    n_ctx = min(target.n_ctx, drafter.n_ctx or target.n_ctx)
    draft_calls_before = drafter.calls  # a drafter object may be reused across runs

    result = DecodeResult(k_max=k_policy.k_max)
    cache = getattr(drafter, "target_cache", None) or target.new_cache()
    cache.rollback(0)
    drafter.rollback(0)
    ids = list(prompt)  # the whole text; ids[-1] is never in a cache at a round's start
    if n_tokens and len(prompt) > 1:
        target.forward(prompt[:-1], cache, last_only=True)  # prefill; these logits are not needed
        result.target_calls += 1

    def emit(token: int, kind: str) -> None:
        ids.append(token)
        result.tokens.append(token)
        if on_token:
            on_token(token, kind)

    while len(result.tokens) < n_tokens:
        # Draft fewer near the end: a round emits up to k+1 tokens, and the
        # verification pass reaches position len(ids) - 1 + k < n_ctx.
        k = min(k_policy.next_k(), n_tokens - len(result.tokens) - 1, n_ctx - len(ids))

        # Step 1 (Algorithm 1, "sample gamma guesses from M_q autoregressively").
        drafts, q = drafter.propose(ids, k, params, rng) if k > 0 else ([], None)
        k = len(drafts)  # a drafter may propose fewer (the n-gram drafter when nothing matches)

        # Step 2 ("run M_p in parallel"): one pass over the unseen token and the drafts.
        # NOTE: logits row i verifies drafts[i]; row k is the bonus position.
        logits = target.forward([ids[-1], *drafts], cache)  # [k+1, n_vocab]
        result.target_calls += 1

        # Steps 3-4: accept a prefix of the drafts, then emit one token from the target.
        if params.greedy:
            n_accepted, last = _verify_greedy(drafts, logits)
        else:
            n_accepted, last = _verify_sampled(drafts, q, probabilities(logits, params), rng)
        for token in drafts[:n_accepted]:
            emit(token, "draft")
        emit(last, "bonus" if n_accepted == k and k > 0 else "target")

        # Both caches keep exactly the accepted text; its newest token is fed next round.
        cache.rollback(len(ids) - 1)
        drafter.rollback(len(ids) - 1)

        result.k_per_round.append(k)
        result.accepted_per_round.append(n_accepted)
        if k > 0:
            k_policy.update(k, n_accepted)

    result.draft_calls = drafter.calls - draft_calls_before
    return result


def _verify_greedy(drafts: list[int], logits: np.ndarray) -> tuple[int, int]:
    """Temperature 0: keep drafts while each equals the target's argmax.

    Returns (number accepted, the token to emit after them): the target's argmax
    at the first mismatch, or at row k (the bonus) when all match. This is the
    sampled rule with p and q both point masses on their argmax.
    """
    for i, x in enumerate(drafts):
        best = greedy(logits[i])
        if x != best:
            return i, best
    return len(drafts), greedy(logits[len(drafts)])


def _verify_sampled(drafts: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Rejection sampling over drafts (Algorithm 1, steps 3-4).

    drafts: k tokens; q: [k, n_vocab] draft distributions they were drawn from;
    p: [k+1, n_vocab] target distributions (already filtered like q).
    """
    for i, x in enumerate(drafts):
        # Accept with probability min(1, p(x)/q(x)): r < p/q, written without
        # the division. q[i, x] > 0 because x was drawn from q[i].
        if rng.random() * q[i, x] < p[i, x]:
            continue
        # Rejected: draw from the residual max(0, p - q).
        # NOTE: it must be renormalised; it sums to 1 - sum(min(p, q)), not 1.
        residual = np.maximum(p[i] - q[i], 0)
        mass = residual.sum()
        if mass <= 0:  # p == q up to rounding: then the rejection itself had
            return i, draw(p[i], rng)  # probability ~0, and p is the right answer
        return i, draw(residual / mass, rng)
    # NOTE: all k accepted: the target's row k is a free extra token (the bonus).
    return len(drafts), draw(p[len(drafts)], rng)
