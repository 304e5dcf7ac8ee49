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
     (verification="block" replaces steps 3-4 by block verification, Sun et al.,
     arXiv 2403.10444: the drafts judged jointly, the same output law, never
     fewer tokens per round in expectation; verify.block_chain.)
  5. Roll back: both caches keep exactly the accepted text.
So every round emits between 1 and k+1 tokens for a single target pass. Steps
3-4, and the proof that the output is exactly p, are in verify/; what a
drafter must provide is in interfaces.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .costmodel import confidence_bar, make_k_policy, make_tree_policy
from .drafters import make_drafter
from .drafters.stopping import ConfidenceStop
from .interfaces import Drafter, KPolicy, Proposal, features_asked
from .model.base import CausalLM
from .model.attention import KVCache
from .request import TREES_REFUSED, Request, make_request, make_rng
from .result import DecodeResult, TokenCallback
from .sampling import SamplingParams, check_finite_logits
from .timing import measure_costs
from .verify import verify

# on_round(proposal, logits) is called after each verification pass: the round's
# Proposal (tokens and q rows) and the target's logits over [ids[-1], *tokens].
RoundCallback = Callable[[Proposal, np.ndarray], None]


def speculative_sample(
    target: CausalLM, draft, prompt_ids, n_tokens: int, K=4,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
    seed: int | None = None, rng: np.random.Generator | None = None, on_token: TokenCallback | None = None,
    tree=None, acceptance: str = "exact", chat: bool = False, verification: str = "token",
    on_round: RoundCallback | None = None, allow_special: bool = False, cross_vocab: str | None = None,
    draft_confidence: float | None = None,
) -> DecodeResult:  # fmt: skip
    """Generate n_tokens after prompt_ids by speculative sampling: exactly the target's distribution.

    prompt_ids: token ids, or text when the target has a tokenizer. draft: a model with the target's
    vocabulary, "ngram[:N]", "early_exit:L" or a Drafter. K: an int, "adaptive", "auto" or a KPolicy.
    tree: None drafts a chain of K tokens; N a tree of up to N tokens and depth K per round; "auto" lets
    the tree cost model (costmodel/trees.py) pick N each round; or a tree policy. acceptance="typical" is
    Medusa's typical acceptance: faster, LOSSY (the output no longer follows the target), opt-in only.
    chat=True: the text is a user message to a chat model; decoding stops after the token ending the reply.
    allow_special=True: control strings typed in the text ("<|im_end|>") become control tokens; by default
    they are plain text (request.check_request).
    verification: how a chain is judged, "token" (draft by draft, the papers' rule) or "block" (jointly,
    Sun et al.: exact too, never fewer tokens per round in expectation); chains only. With tree=N, "token"
    is SpecInfer's rule and "spectr" SpecTr's k-sequential selection, which needs a drafter drawing
    siblings i.i.d. (ModelDrafter(model, siblings="iid"), EarlyExitDrafter(target, L, siblings="iid")),
    and "traversal" traversal verification (Weng et al.: the tree judged from the leaves, whole paths).
    on_round(proposal, logits): called after each verification pass (for measurements; see RoundCallback).
    cross_vocab: a draft model with ANOTHER tokenizer, verified exactly by Timor et al.'s rules
    (drafters/crossvocab.py): "tli" (token-level intersection, any temperature), "slem"
    (string-level exact match, greedy only) or "slrs" (string-level rejection sampling, any
    temperature where the vocabularies are small enough: its q sums over draft tokenizations).
    draft_confidence: a bar in (0, 1]: each round's chain ends before the position where the draft's own
    confidence that the chain survives would fall below it (drafters/stopping.py), so that rounds where
    the draft is unsure verify fewer drafts, or none; exact at every temperature. Chains only. "auto": the
    bar the measured costs set, c + r(2) - 1 (costmodel.confidence_bar; timed once, before the run).
        out = speculative_sample(target, draft, ids, n_tokens=40, K=4, temperature=0.8, seed=0)
    """
    params = SamplingParams(temperature, top_k, top_p)
    rng = make_rng(seed, rng)
    drafter = make_drafter(draft, target, cross_vocab, confidence=draft_confidence)
    request = make_request(target, prompt_ids, n_tokens, params, chat, allow_special, acceptance, verification, tree,
                           drafter)  # fmt: skip
    costs = functools.cache(lambda: measure_costs(target, drafter, request.prompt))  # "auto" (K, the bar): once

    if draft_confidence == "auto":
        if tree is not None:
            raise ValueError(TREES_REFUSED)
        drafter.stop = auto_stop(costs())
    k_policy = make_k_policy(K, costs=costs)
    tree_policy = make_tree_policy(tree, drafter, target)
    return decode_speculative(target, drafter, request, k_policy, tree_policy, rng, on_token, on_round)


def auto_stop(costs) -> ConfidenceStop:
    """draft_confidence="auto": a stop at the bar these measured costs set (costmodel.confidence_bar: c + r(2) - 1)."""
    return ConfidenceStop(confidence_bar(costs.c, costs.r))


def decode_speculative(
    target: CausalLM, drafter: Drafter, request: Request, k_policy: KPolicy, tree_policy, rng: np.random.Generator,
    on_token: TokenCallback | None = None, on_round: RoundCallback | None = None,
) -> DecodeResult:  # fmt: skip
    """The rounds of speculative_sample on a checked request (request.make_request), with a built drafter and
    K and tree policies: Leviathan et al.'s Algorithm 1, repeated until n_tokens are emitted."""
    prompt, n_tokens, params = request.prompt, request.n_tokens, request.params
    seq = Sequence(request, target.new_cache(), rng, DecodeResult(k_max=k_policy.k_max, tokenizer=target.tokenizer),
                   on_token)  # fmt: skip
    result = seq.result
    n_ctx = min(target.n_ctx, drafter.n_ctx or target.n_ctx)
    draft_calls_before = drafter.calls  # a drafter object may be reused across runs (count_draft_passes)

    drafter.begin(target, seq.cache, prompt)
    if len(prompt) > 1:  # prefill: the prompt but its last token (logits not needed)
        _, hidden = target.forward(prompt[:-1], seq.cache, last_only=True, return_hidden=features_asked(drafter))
        result.target_calls += 1
        drafter.commit(prompt, hidden)

    while len(result.tokens) < n_tokens:
        ids = seq.ids  # the whole text so far; ids[-1] is in no cache yet
        # Draft fewer near the end: a round emits up to k+1 tokens and verifies up to position len(ids)-1+k.
        k = min(k_policy.next_k(), n_tokens - len(result.tokens) - 1, n_ctx - len(ids))
        # A tree: at most `nodes` tokens, depth at most k; None: a chain of k.
        nodes = tree_policy.next_nodes()
        nodes = nodes and min(nodes, n_ctx - len(ids))

        # Step 1 ("sample gamma guesses from M_q autoregressively"); fewer is fine (an n-gram miss).
        proposal = drafter.propose(ids, k, params, rng, nodes) if k > 0 else Proposal.chain([])

        # Step 2 ("run M_p in parallel"): one target pass over the unseen token and the drafts.
        # NOTE: logits row i verifies proposal.tokens[i]; the last row is the bonus position.
        tokens, parents = [ids[-1], *proposal.tokens], proposal.pass_parents()
        logits, hidden = target.forward(tokens, seq.cache, return_hidden=features_asked(drafter), parents=parents)
        check_finite_logits(logits, target.name)  # NaN weights would otherwise pass as token 0
        result.target_calls += 1
        if on_round:
            on_round(proposal, logits)

        # Steps 3-5: accept, emit the accepted drafts and one target token, roll the target's cache back.
        path = settle(seq, proposal, logits)
        if seq.ended:  # the end of a chat reply: nothing after it is emitted, and decoding ends
            break
        # The drafter rolls back too, and gets the target's hidden states at the rows kept.
        drafter.commit(seq.ids, hidden[kept_rows(path)])
        if len(proposal):
            k_policy.update(proposal.depth, len(path))  # a chain's depth is its length
            tree_policy.update(proposal.parents, path)

    count_draft_passes(seq, drafter, draft_calls_before)
    return result


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
        return self.prompt + self.result.tokens

    def emit(self, tokens: list[int], kinds: list[str], stop: int | None) -> None:
        """Append tokens (telling on_token each), stopping after `stop`, the end of a chat reply."""
        for token, kind in zip(tokens, kinds):
            self.result.tokens.append(token)
            if self.on_token:
                self.on_token(token, kind)
            if token == stop:
                self.ended = True
                return


def settle(seq: Sequence, proposal: Proposal, logits: np.ndarray) -> list[int]:
    """Steps 3-5 of a round: judge the drafts by the target's logits over [ids[-1], *proposal.tokens],
    emit the accepted drafts and the target's own token, record the round, and roll the target's cache
    back to the accepted seq. Returns the accepted path (indices into proposal.tokens)."""
    n_past, request = len(seq.prompt) + len(seq.result.tokens) - 1, seq.request  # the cache's length before the pass
    # Steps 3-4 ("determine the number of accepted guesses n"; "adjust the distribution from M_p if needed").
    path, last = verify(proposal, logits, request.params, seq.rng, request.acceptance, request.verification)
    leaf = proposal.ends_at_leaf(path)  # after a leaf the target's token is a bonus
    kinds = ["draft"] * len(path) + ["bonus" if leaf and len(proposal) else "target"]
    seq.emit([proposal.tokens[i] for i in path] + [last], kinds, request.stop)
    seq.result.add_round(len(proposal), len(path), judged=len(path) + (not leaf))
    if seq.ended:
        return path
    # Step 5: the cache keeps row 0 of the pass (ids[-1]) and the accepted rows; `last` is fed next round.
    # A tree's accepted path lies among rejected siblings: its rows move together first (a chain's are in place).
    if not proposal.is_chain:
        seq.cache.keep(n_past, kept_rows(path))
    keep_accepted(seq, n_past, len(path))
    return path


def count_draft_passes(seq: Sequence, drafter: Drafter, since: int) -> None:
    """Record the sequence's draft passes: every forward pass its drafter has made for it, `calls` now
    less `since` (its `calls` when the sequence began), while proposing AND while committing.

    NOTE: commit runs passes too: an EAGLE head feeds each accepted token's feature through its block
    after every target pass (drafters/eagle.py). Counting only around propose under-counts it.
    """
    seq.result.draft_calls = drafter.calls - since


def kept_rows(path: list[int]) -> list[int]:
    """The rows of the verification pass that hold accepted text: row 0 (ids[-1]) and each accepted draft's."""
    return [0, *(i + 1 for i in path)]


def keep_accepted(seq: Sequence, n_past: int, n_accepted: int) -> None:
    """Step 5's length: the cache keeps ids[-1] and ITS accepted drafts, n_past + 1 + n_accepted positions.

    NOTE: the length is the sequence's own. In a batch (batch.py) every row has its own
    cache and length; one shared counter for the batch (every row rolled back by some
    other row's acceptance) leaves rejected drafts in one cache and drops accepted text
    from another: the batch tests' broken control does exactly that and fails.
    """
    seq.cache.rollback(n_past + 1 + n_accepted)
