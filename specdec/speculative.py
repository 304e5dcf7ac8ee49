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
  5. Roll back: both caches keep exactly the accepted text.
So every round emits between 1 and k+1 tokens for a single target pass. The proof
that the output is exactly p is in verify/__init__.py; what a drafter must provide
is in interfaces.py; the settings and their checks are in config.py.

The round reads as the papers' round; what goes beyond it joins it at one place each:
- how many to draft: K fixed (the papers), or a K policy (adaptive, or the cost model's: costmodel/);
- what is drafted: a chain (the papers), or a tree of candidates (`nodes`: a tree policy; SpecInfer, EAGLE-2);
- how drafts are judged (steps 3-4): the papers' token-wise rule for a chain (verify/chain.py), or
  block verification, SpecInfer's, SpecTr's, traversal or typical acceptance (verify/, via verify.verify);
- what the drafter is: a smaller model (the papers), a lookup, the target's first layers, heads reading
  the target's hidden states (drafters/), each reading the features the pass returns;
- several sequences at once: batch.py runs steps 3-5 (`settle`) row by row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import verify as rules
from .config import Config, Request, Setup, make_config, make_rng, setup
from .interfaces import Proposal, features_asked
from .model.attention import KVCache
from .model.base import CausalLM
from .result import DecodeResult, TokenCallback
from .sampling import check_finite_logits, probabilities

# on_round(proposal, logits) is called after each verification pass: the round's
# Proposal (tokens and q rows) and the target's logits over [ids[-1], *tokens].
RoundCallback = Callable[[Proposal, np.ndarray], None]


def speculative_sample(
    target: CausalLM,
    draft,
    prompt_ids,
    n_tokens: int,
    K=None,
    temperature: float | None = None,
    *,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
    on_token: TokenCallback | None = None,
    on_round: RoundCallback | None = None,
    config: Config | None = None,
    **settings,
) -> DecodeResult:
    """Generate n_tokens after prompt_ids (ids, or text) by speculative sampling: exactly the target's distribution.

    draft: a model with the target's vocabulary, a drafter spec ("ngram", "suffix", "eagle", "suffix+eagle", ...) or
    a Drafter. K: drafts per round (4; suffix decoding sizes its own, up to 32), "adaptive", "auto" or a KPolicy.
    temperature 0 (the default) is greedy. Every other setting of a Config (top_k, top_p, chat, tree, verification,
    draft_confidence, ...) by name, or config= (config.py says each). on_token(token, kind) is told each emitted
    token; on_round(proposal, logits) each verification pass.

        out = speculative_sample(target, draft, ids, n_tokens=40, K=4, temperature=0.8, seed=0)
    """
    config = make_config(config, K=K, temperature=temperature, **settings)
    run = setup(target, draft, prompt_ids, n_tokens, config)
    return decode_speculative(run, make_rng(seed, rng), on_token, on_round)


def decode_speculative(
    run: Setup, rng: np.random.Generator, on_token: TokenCallback | None = None, on_round: RoundCallback | None = None
) -> DecodeResult:
    """The rounds of a run built by config.setup: Leviathan et al.'s Algorithm 1, until n_tokens are emitted."""
    target, drafter, request = run.target, run.drafter, run.request
    k_policy, tree_policy = run.k_policy(), run.tree_policy()  # None, None: K drafts in a chain, every round
    result = DecodeResult(k_max=run.config.K if k_policy is None else k_policy.k_max, tokenizer=target.tokenizer)
    seq = Sequence(request, target.new_cache(), rng, result, on_token)
    n_ctx, calls_before = min(target.n_ctx, drafter.n_ctx or target.n_ctx), drafter.calls
    asked = features_asked(drafter)  # the target's hidden states a drafter reads (EAGLE: the final one)
    drafter.begin(target, seq.cache, request.prompt)
    if len(request.prompt) > 1:  # prefill: the prompt but its last token (no logits needed)
        _, hidden = target.forward(request.prompt[:-1], seq.cache, last_only=True, return_hidden=asked)
        seq.result.target_calls += 1
        drafter.commit(request.prompt, hidden)

    while len(seq.result.tokens) < request.n_tokens and not seq.ended:
        ids = seq.ids  # the whole text so far; ids[-1] is in no cache yet
        # Draft fewer near the end: a round emits up to k+1 tokens and verifies up to position len(ids)-1+k.
        k = run.config.K if k_policy is None else k_policy.next_k()
        k = min(k, request.n_tokens - len(seq.result.tokens) - 1, n_ctx - len(ids))
        nodes = None if tree_policy is None else min(tree_policy.next_nodes(), n_ctx - len(ids))  # a tree's budget

        # Step 1 ("sample gamma guesses from M_q autoregressively"); fewer is fine (a lookup that found nothing).
        proposal = drafter.propose(ids, k, request.params, rng, nodes) if k > 0 else Proposal.chain([])

        # Step 2 ("run M_p in parallel"): one target pass over the unseen token and the drafts.
        # NOTE: logits row i verifies proposal.tokens[i]; the last row is the bonus position.
        tokens, parents = [ids[-1], *proposal.tokens], proposal.pass_parents()
        logits, hidden = target.forward(tokens, seq.cache, return_hidden=asked, parents=parents)
        check_finite_logits(logits, target.name)  # NaN weights would otherwise pass as token 0
        seq.result.target_calls += 1
        if on_round:
            on_round(proposal, logits)

        # Steps 3-5: accept, emit the accepted drafts and one target token, roll the target's cache back.
        path = settle(seq, proposal, logits)
        if not seq.ended:  # the drafter rolls back too, and reads the target's features at the rows kept
            drafter.commit(seq.ids, hidden[[0, *(i + 1 for i in path)]])
        if len(proposal) and k_policy is not None:
            k_policy.update(proposal.depth, len(path))  # a chain's depth is its length
        if len(proposal) and tree_policy is not None:
            tree_policy.update(proposal.parents, path)
    # NOTE: every draft pass counts, committing ones too (an EAGLE head feeds each accepted token's feature).
    seq.result.draft_calls = drafter.calls - calls_before
    return seq.result


# ---------------------------------------------------------------------------
# Steps 3-5 of a round for one sequence: the batched sampler (batch.py) runs them row by row.
# ---------------------------------------------------------------------------


@dataclass
class Sequence:
    """One sequence being decoded and what is its own: its request, the target's KV cache, randomness, record."""

    request: Request  # its prompt (token ids) and settings, checked
    cache: KVCache  # the target's; its length is len(ids) - 1 after every round
    rng: np.random.Generator
    result: DecodeResult  # the new tokens and the per-round record
    on_token: TokenCallback | None = None  # told each emitted token and its kind
    ended: bool = False  # the end of a chat reply was emitted: decoding is over

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt

    @property
    def ids(self) -> list[int]:
        """The whole text so far; ids[-1] is in no cache yet."""
        return self.request.prompt + self.result.tokens

    def emit(self, tokens: list[int], kinds: list[str]) -> int:
        """Append tokens (telling on_token each), up to the end of a chat reply; returns how many."""
        for n, (token, kind) in enumerate(zip(tokens, kinds), start=1):
            self.result.tokens.append(token)
            if self.on_token:
                self.on_token(token, kind)
            if token == self.request.stop:
                self.ended = True
                return n
        return len(tokens)


def settle(seq: Sequence, proposal: Proposal, logits: np.ndarray) -> list[int]:
    """Steps 3-5 on the target's logits over [ids[-1], *proposal.tokens]; returns the accepted path (node indices)."""
    request, n_past = seq.request, len(seq.ids) - 1  # the cache's length before the pass
    path, last = verify(proposal, logits, request.params, seq.rng, request.acceptance, request.verification)
    leaf = proposal.ends_at_leaf(path)  # after a leaf (all of a chain accepted) the target's token is a bonus
    kinds = ["draft"] * len(path) + ["bonus" if leaf and len(proposal) else "target"]
    n_drafts = min(len(path), seq.emit([proposal.tokens[i] for i in path] + [last], kinds))  # fewer: a reply ended
    seq.result.k_per_round.append(len(proposal))
    seq.result.accepted_per_round.append(n_drafts)
    seq.result.judged_per_round.append(n_drafts + (n_drafts == len(path) and not leaf))  # and a rejected depth
    # Step 5: the cache keeps row 0 of the pass (ids[-1]) and the accepted rows; `last` is fed next round.
    # NOTE: a tree's accepted path lies among rejected siblings: its rows move together first (a chain's are in place).
    if not proposal.is_chain:
        seq.cache.keep(n_past, [0, *(i + 1 for i in path)])
    keep_accepted(seq, n_past, len(path))
    return path


def verify(proposal: Proposal, logits: np.ndarray, params, rng, acceptance: str, verification: str):
    """Steps 3-4 ("determine the number of accepted guesses n"; "adjust the distribution from M_p if needed"):
    (the accepted path, the target's token after it). The papers' rule for a chain; the others in verify/."""
    if proposal.is_chain and verification == "token" and acceptance == "exact":
        if params.greedy:
            n_accepted, last = rules.greedy_chain(proposal.tokens, logits)
        else:  # p: [k+1, n_vocab], filtered as the draft's q was
            n_accepted, last = rules.sampled_chain(proposal.tokens, proposal.q, probabilities(logits, params), rng)
        return list(range(n_accepted)), last
    return rules.verify(proposal, logits, params, rng, acceptance, verification)  # block, trees, SpecTr, typical


def keep_accepted(seq: Sequence, n_past: int, n_accepted: int) -> None:
    """Step 5's length: the cache keeps ids[-1] and ITS accepted drafts. NOTE: in a batch every row has its own."""
    seq.cache.rollback(n_past + 1 + n_accepted)
