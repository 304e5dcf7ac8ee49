"""Batched speculative decoding: B prompts at once, one target pass per round for the whole batch.

What it adds over speculative.py: the same round (draft, verify, accept, residual,
bonus, roll back), run for B sequences side by side. Each weight matrix is then
read once per round for all B sequences (model/base.LanguageModel.forward_batch), which is
what a batch buys on memory-bound hardware. Letters as in speculative.py:
p is the TARGET's distribution, q the DRAFT's.

The hard part is that the batch is RAGGED after the first round: each sequence
accepts a different number of drafts, so the sequences' lengths drift apart.
Here that state is explicit, one `Sequence` per prompt:

    ids          its whole text so far (prompt + emitted tokens); ids[-1] is in no cache yet
    cache        its own target KV cache, whose length is len(ids) - 1 after every round
    rng          its own random generator
    k_policy     its own K policy (adaptive K follows its own acceptances)
    result       its own DecodeResult: tokens, rounds, acceptances

and the model packs the ragged rows with no padding and no mask between them
(forward_batch: the rows' new tokens are concatenated for the matrix products;
attention runs per row against the row's own cache). Rolling back is per row
(cache length), and a row that has its n_tokens (or its end of reply) leaves
the batch; the others go on with a smaller batch.

Why each row is still exactly its own target distribution: a row's round reads
only its own cache, its own drafts, its own q and p rows and its own random
draws. Nothing in verify/ sees another row, so the proof in verify/ holds
row by row. Row b's logits are those an unbatched pass would compute, up to
float32 rounding in the packed matrix products.

Seeds: seed=s gives EVERY row np.random.default_rng(s), the generator an unbatched
call with seed=s would use, so a row's tokens do not depend on which prompts
share its batch (the same prompt twice with one seed gives the same text twice;
pass a list of seeds for different ones).

    outs = speculative_sample_batch(target, draft, ["The cat", "A long time ago"], 40, K=4)
    [out.text for out in outs]

Left out here: trees (tree=...) and learned heads as batched drafts; see docs/batch.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .config import Config, check_seed, make_config, setup
from .costmodel import AdaptiveK, FixedK
from .drafters import EarlyExitDrafter, LookupFirst, ModelDrafter, NgramDrafter
from .interfaces import KPolicy, Proposal, features_asked
from .model.base import CausalLM, LanguageModel
from .model.attention import KVCache, check_rows_fit
from .result import DecodeResult
from .sampling import SamplingParams, check_finite_logits, draw, greedy, probabilities
from .speculative import Sequence, settle
from .verify import VERIFICATION

# on_token(row, token, kind): as speculative_sample's on_token, with the prompt's index first.
BatchTokenCallback = Callable[[int, int, str], None]


@dataclass
class Row(Sequence):
    """One prompt of the batch: a Sequence (speculative.py: its prompt, cache, randomness and record) and its place."""

    index: int = 0  # its place in the caller's list of prompts
    k_policy: KPolicy | None = None  # its own K policy (adaptive K follows its own acceptances)
    done: bool = False  # it has its tokens (or its end of reply) and has left the batch

    def finish(self, n_tokens: int) -> None:
        """Leave the batch once the reply has ended or the row has its n_tokens."""
        self.done = self.ended or len(self.result.tokens) >= n_tokens


@dataclass
class BatchRound:
    """One round of the batch, for `on_batch_round`: who took part, what each drafted and accepted."""

    rows: list[int]  # indices of the prompts in the batch this round
    k: list[int]  # drafts proposed, per row
    accepted: list[int]  # of which accepted, per row
    draft_passes: int  # batched draft forward passes this round (0 for a lookup)
    new_tokens: list[int] = field(default_factory=list)  # tokens emitted, per row


def make_rngs(n_rows: int, seed, rng: np.random.Generator | None) -> list[np.random.Generator]:
    """One generator per row: seed=s -> default_rng(s) for every row (what an unbatched call with seed s
    uses); a list of seeds -> one each; rng -> one seed per row drawn from it; neither -> fresh randomness per row."""
    if seed is not None and rng is not None:
        raise ValueError("pass either seed or rng, not both")
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {rng!r:.80}")
        return [np.random.default_rng(int(s)) for s in rng.integers(0, 2**63, n_rows)]  # one child seed per row
    if isinstance(seed, (list, tuple)):
        if len(seed) != n_rows:
            raise ValueError(f"seed lists one seed per prompt: got {len(seed)} seeds for {n_rows} prompts")
        return [np.random.default_rng(check_seed(s)) for s in seed]
    return [np.random.default_rng(check_seed(seed)) for _ in range(n_rows)]


def check_batch_memory(model, n_rows: int, n_tokens: int, what: str) -> None:
    """ValueError before any row is made when n_rows rows' KV caches cannot fit the memory free now: each row
    holds at least n_tokens + 1 positions of the model's (and at least the 64 a KVCache reserves at once)."""
    check_rows_fit(model.hparams, n_rows, max(64, n_tokens + 1), what, model.dtype)


def start_batch(
    model, draft, prompts, n_tokens: int, seed, rng, on_token: BatchTokenCallback | None, config: Config
) -> tuple[list[Row], object]:
    """Check every prompt and the draft with the settings every row shares (config.setup, as the unbatched
    samplers do) and give each prompt its Row. Returns the rows and the built drafter (None without a draft)."""
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts (each text or token ids)")
    check_batch_memory(model, len(prompts), n_tokens, f"{len(prompts)} prompts decoded together")
    run = setup(model, draft, prompts[0], n_tokens, config)
    requests = [run.request, *(run.request_for(prompt) for prompt in prompts[1:])]
    rngs = make_rngs(len(requests), seed, rng)
    rows = [
        Row(
            r,
            model.new_cache(),
            rngs[i],
            DecodeResult(tokenizer=model.tokenizer),
            on_token and partial(on_token, i),
            index=i,
        )
        for i, r in enumerate(requests)
    ]
    return rows, run.drafter


# ---------------------------------------------------------------------------
# The baseline: one batched target pass per token.
# ---------------------------------------------------------------------------


def autoregressive_sample_batch(
    model: CausalLM,
    prompts,
    n_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed=None,
    rng: np.random.Generator | None = None,
    on_token: BatchTokenCallback | None = None,
    chat: bool = False,
    allow_special: bool = False,
) -> list[DecodeResult]:
    """autoregressive_sample for each prompt, one forward_batch per step for all of them: a DecodeResult each.

    Row b's tokens are those autoregressive_sample(model, prompts[b], n_tokens, ..., seed=seed)
    gives (same seed rule; see the module docstring).
    """
    config = make_config(temperature=temperature, top_k=top_k, top_p=top_p, chat=chat, allow_special=allow_special)
    params = config.params
    rows, _ = start_batch(model, None, prompts, n_tokens, seed, rng, on_token, config)
    new = {row.index: row.prompt for row in rows}  # what each row feeds next: its prompt, then its last token
    active = [row for row in rows if n_tokens > 0]
    while active:
        logits = model.forward_batch([new[row.index] for row in active], [row.cache for row in active], last_only=True)
        for row, row_logits in zip(active, logits):
            row_logits = check_finite_logits(row_logits[0], model.name)  # [n_vocab]
            row.result.target_calls += 1
            token = greedy(row_logits) if params.greedy else draw(probabilities(row_logits[None], params)[0], row.rng)
            row.emit([token], ["target"])
            row.finish(n_tokens)
            new[row.index] = [token]
        active = [row for row in active if not row.done]  # finished rows leave the batch
    return [row.result for row in rows]


# ---------------------------------------------------------------------------
# Drafting for a batch.
# ---------------------------------------------------------------------------


class BatchModelDraft:
    """A draft model's k steps for every row at once: each step is ONE forward_batch over the rows still drafting.

    A separate draft model (the papers' setting) keeps one KV cache per row.
    Early exit (n_layer set, model = the target) writes into the rows' TARGET
    caches through the first n_layer blocks and sets them back, as
    drafters.EarlyExitDrafter does for one sequence.
    """

    def __init__(self, model, n_layer: int | None = None):
        self.model, self.n_layer = model, n_layer
        self.caches: dict[int, KVCache] = {}  # row index -> the cache this drafter feeds
        self.n_ctx = model.n_ctx

    def begin(self, rows: list[Row]) -> None:
        self.caches = {row.index: row.cache if self.n_layer else self.model.new_cache() for row in rows}

    def after_prefill(self, row: Row, hidden: np.ndarray) -> None:
        pass  # a draft model catches up on the prompt in its first step

    def propose(self, rows: list[Row], ks: list[int], params: SamplingParams) -> tuple[list[Proposal], int]:
        """(one chain per row, the number of batched draft passes)."""
        caches = [self.caches[row.index] for row in rows]
        starts = [cache.length for cache in caches]
        # Each row catches up on the text its cache has not seen (ragged: the prompt in the
        # first round; later the last emitted token, and after a fully accepted round the last draft too).
        new = [row.ids[start:] for row, start in zip(rows, starts)]
        tokens: list[list[int]] = [[] for _ in rows]
        q_rows: list[list[np.ndarray]] = [[] for _ in rows]
        n_passes = max(ks, default=0)
        for step in range(n_passes):
            drafting = [i for i, k in enumerate(ks) if k > step]  # rows asking for fewer drafts stop early
            logits = self.model.forward_batch(
                [new[i] for i in drafting], [caches[i] for i in drafting], last_only=True, n_layer=self.n_layer
            )
            for i, row_logits in zip(drafting, logits):
                rows[i].result.draft_calls += 1
                if params.greedy:
                    token = greedy(row_logits[0])
                else:
                    q = probabilities(row_logits, params)[0]  # [n_vocab], filtered like the target
                    token = draw(q, rows[i].rng)  # drawn from exactly the q the acceptance test reads
                    q_rows[i].append(q)
                tokens[i].append(token)
                new[i] = [token]
        if self.n_layer:  # early exit wrote into the target's caches: the target verifies from the start
            for cache, start in zip(caches, starts):
                cache.rollback(start)
        proposals = [Proposal.chain(t, np.stack(q) if q else None) for t, q in zip(tokens, q_rows)]
        return proposals, n_passes

    def commit(self, row: Row, hidden: np.ndarray) -> None:
        if not self.n_layer:  # keep only accepted text: everything but ids[-1], which no cache has seen
            cache = self.caches[row.index]
            cache.rollback(min(cache.length, len(row.ids) - 1))


class PerRowDrafts:
    """One unbatched drafter per row (n-gram lookup, Medusa or EAGLE heads), each with the Drafter interface.

    make() gives a row its drafter: its own per-sequence state (a head's KV cache, its kept hidden
    state) over weights read once for the whole batch (the drafters' `fresh`).
    The target's pass is still one batched pass per round; only the drafting is per row.
    A row's draft passes are its drafter's, proposing and committing, counted as an unbatched run
    counts them (speculative.decode_speculative) after every call on the row's drafter.
    """

    def __init__(self, make: Callable[[], object], target):
        self.make, self.target = make, target
        self.drafters: dict[int, object] = {}
        self.calls_before: dict[int, int] = {}  # row index -> its drafter's `calls` before the row began
        self.n_ctx = None
        self.hidden_layers = None  # set by begin: what its drafters read of the target (interfaces.features_asked)

    def begin(self, rows: list[Row]) -> None:
        self.drafters = {row.index: self.make() for row in rows}
        self.calls_before = {index: drafter.calls for index, drafter in self.drafters.items()}
        for row in rows:
            self.drafters[row.index].begin(self.target, row.cache, row.prompt)
        self.n_ctx = self.drafters[rows[0].index].n_ctx
        self.hidden_layers = getattr(self.drafters[rows[0].index], "hidden_layers", None)  # interfaces.features_asked

    def after_prefill(self, row: Row, hidden: np.ndarray) -> None:
        self.drafters[row.index].commit(row.prompt, hidden)
        self.count(row)

    def propose(self, rows: list[Row], ks: list[int], params: SamplingParams) -> tuple[list[Proposal], int]:
        proposals = []
        for row, k in zip(rows, ks):
            drafter = self.drafters[row.index]
            proposals.append(drafter.propose(row.ids, k, params, row.rng) if k > 0 else Proposal.chain([]))
            self.count(row)
        return proposals, 0

    def commit(self, row: Row, hidden: np.ndarray) -> None:
        self.drafters[row.index].commit(row.ids, hidden)
        self.count(row)

    def count(self, row: Row) -> None:
        """Every draft pass the row's drafter made for it so far, proposing and committing (as speculative.py counts)."""
        row.result.draft_calls = self.drafters[row.index].calls - self.calls_before[row.index]


def batch_drafts(drafter, target):
    """How a built drafter drafts for a batch: a model or early exit in batched passes; a lookup or heads per row."""
    if isinstance(drafter, ModelDrafter):
        return BatchModelDraft(drafter.model)
    if isinstance(drafter, EarlyExitDrafter):
        return BatchModelDraft(target, n_layer=drafter.n_layer)
    drafter.fresh()  # refused now, before any row runs, where a row cannot have its own (lookup_first.py)
    return PerRowDrafts(drafter.fresh, target)  # each row: its own drafting state, the weights shared


def make_row_k_policy(config: Config):
    """A fresh K policy for one row: K is an int or 'adaptive' (each row adapts to its own acceptances)."""
    K = config.K
    if K == "auto" or isinstance(K, KPolicy) and not isinstance(K, (FixedK, AdaptiveK)):
        raise ValueError(
            "a batch takes K as an int or 'adaptive' (one policy per row); for the best K per batch "
            "size see costmodel.best_k_batch and `python -m specdec.bench --only batch`"
        )
    if isinstance(K, FixedK):
        return FixedK(K.k)
    if isinstance(K, AdaptiveK):
        return AdaptiveK(K.k, K.k_min, K.k_max)
    return AdaptiveK(min(4, config.k_max), 1, config.k_max) if K == "adaptive" else FixedK(K)


# ---------------------------------------------------------------------------
# The batched round.
# ---------------------------------------------------------------------------


def speculative_sample_batch(
    target: CausalLM,
    draft,
    prompts,
    n_tokens: int,
    K=4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed=None,
    rng: np.random.Generator | None = None,
    on_token: BatchTokenCallback | None = None,
    tree=None,
    acceptance: str = "exact",
    chat: bool = False,
    verification: str = "token",
    on_batch_round: Callable[[BatchRound], None] | None = None,
    allow_special: bool = False,
) -> list[DecodeResult]:
    """speculative_sample for each prompt, with ONE target pass per round for the whole batch: a DecodeResult each.

    prompts: a list of prompts (text or token ids), of any lengths. draft: a model
    (GPT2 or Llama: batched draft passes), "early_exit:L" (batched), "ngram[:N]", "medusa:DIR",
    "eagle:DIR" (drafted per row). K: an int or "adaptive" (per row). Other keywords
    as speculative_sample (verification="block": each row's chain judged jointly); seed=s gives every
    row default_rng(s) (module docstring). on_batch_round(BatchRound) is called after every round of the
    batch (the benchmark prices rounds with it).
    """
    if tree is not None:
        raise ValueError("a batch drafts chains only (tree=None); trees run one prompt at a time: speculative_sample")
    if verification not in VERIFICATION:
        raise ValueError(f"a batch judges chains: verification must be 'token' or 'block', got {verification!r}")
    config = make_config(
        K=K,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        chat=chat,
        allow_special=allow_special,
        acceptance=acceptance,
        verification=verification,
    )
    params = config.params
    make_row_k_policy(config)  # refused before any row runs where a row cannot have its own
    if isinstance(draft, (ModelDrafter, EarlyExitDrafter)) and draft.stop is not None:
        raise ValueError(
            "a batch drafts a model's or early exit's chains in batched passes, K for every row: "
            "a draft confidence bar (stop=) is not offered there; build the drafter without one"
        )
    if not isinstance(draft, (str, LanguageModel, ModelDrafter, EarlyExitDrafter, NgramDrafter, LookupFirst)):
        raise ValueError(
            f"a batch needs its draft as a model, 'ngram[:N]', 'early_exit:L', 'medusa:DIR' or 'eagle:DIR' (each row "
            f"then gets its own drafter state), not a {type(draft).__name__} object, whose state the rows would share"
        )
    rows, drafter = start_batch(target, draft, prompts, n_tokens, seed, rng, on_token, config)
    drafts = batch_drafts(drafter, target)
    for row in rows:
        row.k_policy = make_row_k_policy(config)
        row.result.k_max = row.k_policy.k_max
    drafts.begin(rows)
    n_ctx = min(target.n_ctx, drafts.n_ctx or target.n_ctx)

    # Prefill, one forward_batch for every prompt of 2+ tokens: the prompt but its last token (logits not needed).
    active = list(rows)
    prefill = [row for row in active if len(row.prompt) > 1]
    if prefill:
        _, hidden = target.forward_batch(
            [row.prompt[:-1] for row in prefill],
            [row.cache for row in prefill],
            last_only=True,
            return_hidden=features_asked(drafts),
        )
        for row, row_hidden in zip(prefill, hidden):
            row.result.target_calls += 1
            drafts.after_prefill(row, row_hidden)

    while active:
        # Draft fewer near a row's end: a round emits up to k+1 tokens and verifies up to position len(ids)-1+k.
        ks = [min(row.k_policy.next_k(), n_tokens - len(row.result.tokens) - 1, n_ctx - len(row.ids)) for row in active]

        # Step 1, every row: propose k_b drafts (a model drafts all rows in batched passes).
        proposals, draft_passes = drafts.propose(active, ks, params)

        # Step 2, ONE target pass for the whole batch: row b over [ids_b[-1], its drafts], after its own cache.
        # NOTE: within each row, logits row i verifies that row's draft i; its last row is its bonus position.
        logits, hidden = target.forward_batch(
            [[row.ids[-1], *p.tokens] for row, p in zip(active, proposals)],
            [row.cache for row in active],
            return_hidden=features_asked(drafts),
        )

        record = BatchRound([row.index for row in active], [len(p) for p in proposals], [], draft_passes)
        for row, proposal, row_logits, row_hidden in zip(active, proposals, logits, hidden):
            check_finite_logits(row_logits, target.name)
            row.result.target_calls += 1
            # Steps 3-5, per row, with the row's own q, p and random draws (speculative.settle): accepted drafts,
            # then one token; the row's cache keeps ITS accepted text, so every row is now at its own length
            # (the batch is ragged).
            before = len(row.result.tokens)
            path = settle(row, proposal, row_logits)
            record.accepted.append(len(path))
            record.new_tokens.append(len(row.result.tokens) - before)
            # As speculative.py: the drafter gets every pass's kept rows (the round that completes the row's
            # tokens included, so a row's draft passes are those of the row decoded alone), unless the reply ended.
            if not row.ended:
                drafts.commit(row, row_hidden[[0, *(i + 1 for i in path)]])  # the rows kept: ids[-1] and the accepted
                if len(proposal):
                    row.k_policy.update(len(proposal), len(path))
            row.finish(n_tokens)

        active = [row for row in active if not row.done]  # finished rows leave the batch
        if on_batch_round:
            on_batch_round(record)
    return [row.result for row in rows]
