"""Prompt lookup first, another drafter where it finds nothing (drafters/lookup_first.py): which drafter
proposes each round, the spec "ngram+X", greedy outputs unchanged, the target's distribution kept at T=1
(and lost by a variant that judges looked-up tokens by the model's q), batches, and the price of a step."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model
from helpers import chi_square_passes, exact_continuations, perturbed, sample_many, small_model
from test_head_drafters import random_eagle, random_medusa

from specdec import LookupFirst, autoregressive_sample, speculative_sample, speculative_sample_batch
from specdec.drafters import EarlyExitDrafter, ModelDrafter, NgramDrafter, make_drafter
from specdec.drafters.specs import DraftSpec, parse_draft
from specdec.drafters.stopping import ConfidenceStop
from specdec.interfaces import Proposal
from specdec.sampling import SamplingParams
from specdec.costmodel.trees import draft_step_cost
from specdec.timing import measure_costs

T1, GREEDY = SamplingParams(1.0), SamplingParams(0.0)


@pytest.fixture(scope="module")
def pair():
    """A 6-token target and a draft near it: drafts are often but not always accepted."""
    target = small_model(seed=10)
    return target, perturbed(target, 0.4, seed=3)


def test_the_spec_names_the_lookup_and_the_drafter_after_it():
    spec = parse_draft("ngram+eagle")
    assert spec.kind == "lookup_first" and str(spec) == "ngram:3+eagle"
    assert spec.parts() == (DraftSpec("ngram", 3), DraftSpec("eagle", ""))
    assert parse_draft("ngram:4+eagle:heads/x").parts() == (DraftSpec("ngram", 4), DraftSpec("eagle", "heads/x"))
    assert parse_draft("ngram+early_exit:6").parts()[1] == DraftSpec("early_exit", 6)
    assert parse_draft(str(spec)) == spec  # the label it prints reads back the same
    assert spec.describe() == "n-gram lookup (2 <= n <= 3), else the EAGLE head shipped for the target"
    assert parse_draft("ngram:1+medusa:m").describe() == "n-gram lookup (1 <= n <= 1), else Medusa heads from m"
    assert parse_draft("heads+x").kind == "model"  # a '+' elsewhere is part of a model's name or folder


@pytest.mark.parametrize(
    "spec,message",
    [
        ("ngram+", "not nothing"),
        ("ngram+124M", "not a model name"),
        ("ngram+ngram:2", "not another lookup"),
        ("ngram+ngram+eagle", "not another lookup"),
        ("ngram:0+eagle", "N >= 1"),
        ("ngram+early_exit:x", "L >= 1"),
    ],
)
def test_a_spec_it_cannot_build_is_refused_in_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_draft(spec)
    assert "\n" not in str(error.value)
    if "model name" in message:
        assert "LookupFirst(NgramDrafter(n_vocab, 3, 2), ModelDrafter(model))" in str(error.value)  # what instead


def test_each_round_asks_the_lookup_first_and_the_second_drafter_where_it_finds_nothing(pair):
    target, draft = pair
    drafter = LookupFirst(NgramDrafter(target.n_vocab, 3, 2), ModelDrafter(draft))
    drafter.begin(target, target.new_cache(), [1, 2, 3])
    found = drafter.propose([4, 1, 2, 5, 1, 2], 3, T1, np.random.default_rng(0))  # [1, 2] occurred before
    assert found.tokens == [5, 1, 2] and drafter.looked_up == 1 and drafter.calls == 0
    np.testing.assert_array_equal(found.q, np.eye(target.n_vocab, dtype=np.float32)[[5, 1, 2]])  # point masses
    alone = ModelDrafter(draft).propose([4, 1, 2, 5, 2, 1], 3, GREEDY, None)
    drafted = drafter.propose([4, 1, 2, 5, 2, 1], 3, GREEDY, None)  # only the 1-token match [1]: too short
    assert drafted.tokens == alone.tokens and drafter.looked_up == 1 and drafter.calls == 3


def test_make_drafter_builds_it_and_a_bar_cuts_only_the_second_drafter():
    target = tiny_model(seed=1)
    drafter = make_drafter("ngram+early_exit:1", target, confidence=0.4)
    assert isinstance(drafter, LookupFirst) and isinstance(drafter.then, EarlyExitDrafter)
    assert (drafter.lookup.n_max, drafter.lookup.n_min) == (3, 2) and drafter.then.stop == ConfidenceStop(0.4)
    assert drafter.stop == ConfidenceStop(0.4)
    drafter.stop = ConfidenceStop(0.7)  # what "auto" does once the costs are measured
    assert drafter.then.stop.bar == 0.7 and not hasattr(drafter.lookup, "stop")
    assert make_drafter("ngram:1+early_exit:1", target).lookup.n_min == 1  # n_min never above n_max
    with pytest.raises(ValueError, match="siblings"):
        make_drafter("ngram+early_exit:1", target, siblings="iid")
    with pytest.raises(ValueError, match="both must have the target's vocabulary"):
        LookupFirst(NgramDrafter(target.n_vocab + 1), EarlyExitDrafter(target, 1))


@pytest.mark.parametrize("kind", ["model", "early exit", "medusa", "eagle"])
def test_greedy_with_lookup_first_equals_greedy_autoregressive(kind):
    """Repetitive prompts, so that both kinds of round happen; with and without a bar on the second drafter."""
    target = small_model(seed=10, n_layer=2)
    then = {
        "model": lambda: ModelDrafter(perturbed(target, 0.4, seed=3)),
        "early exit": lambda: EarlyExitDrafter(target, 1),
        "medusa": lambda: random_medusa(target),
        "eagle": lambda: random_eagle(target),
    }[kind]
    looked_up = drafted = 0
    for prompt in ([1, 2, 3, 1, 2], [3, 3, 3], [0, 5, 4, 0, 5]):
        plain = autoregressive_sample(target, prompt, 10).tokens
        for bar in (None, 0.5):
            drafter = LookupFirst(NgramDrafter(target.n_vocab, 3, 2), then())
            drafter.stop = bar and ConfidenceStop(bar)
            out = speculative_sample(target, drafter, prompt, 10, K=3)
            assert out.tokens == plain, (kind, prompt, bar)
            looked_up += drafter.looked_up
            drafted += sum(k > 0 for k in out.k_per_round) - drafter.looked_up  # rounds the second drafter drafted
    assert looked_up > 0 and drafted > 0, (looked_up, drafted)


class ModelsQForLookups(LookupFirst):
    """BROKEN: judges the looked-up tokens by the second drafter's q at their positions (the rows a model would
    have drawn from), not by the point masses they were actually drawn from."""

    def propose(self, ids, k, params, rng, nodes=None):
        found = self.lookup.propose(ids, k, params, rng)
        if not len(found):
            return self.then.propose(ids, k, params, rng)
        q = np.stack([self.then.model(list(ids) + found.tokens[:i])[-1] for i in range(len(found))])
        q = np.exp(q - q.max(axis=1, keepdims=True))
        return Proposal.chain(found.tokens, (q / q.sum(axis=1, keepdims=True)).astype(np.float32))


def test_sampling_with_lookup_first_keeps_the_target_distribution(pair):
    """At T=1, 1-token matches allowed so that the lookup proposes in a good share of rounds (about one in six,
    after the prompt [1, 2, 3]), the model in the rest; a variant that judges the lookup's tokens by the wrong q
    fails the same check."""
    target, draft = pair
    prompt = [1, 2, 3]
    exact = exact_continuations(target, prompt, 3, T1)
    drafter, rounds = LookupFirst(NgramDrafter(target.n_vocab, 3, 1), ModelDrafter(draft)), []

    def run(rng):
        out = speculative_sample(target, drafter, prompt, 3, K=2, temperature=1.0, rng=rng)
        rounds.append(len(out.k_per_round))
        return out

    samples = sample_many(run, n_samples=2000)
    assert 300 < drafter.looked_up < sum(rounds) - 300, (drafter.looked_up, sum(rounds))  # many of each kind
    ok, stat, df = chi_square_passes(samples, exact)
    assert ok, f"chi2={stat:.1f} df={df}"

    broken = ModelsQForLookups(NgramDrafter(target.n_vocab, 3, 1), ModelDrafter(draft))

    def run_broken(rng):
        return speculative_sample(target, broken, prompt, 3, K=2, temperature=1.0, rng=rng)

    ok, stat, df = chi_square_passes(sample_many(run_broken, n_samples=1000), exact)
    assert not ok, f"the broken variant passed (chi2={stat:.1f}, df={df})"


def test_a_batch_gives_each_row_its_own_lookup_and_head():
    target = small_model(seed=10, n_layer=2)
    prompts = [[1, 2, 3, 1, 2], [3, 3, 3], [0, 5, 4, 0, 5]]
    out = speculative_sample_batch(
        target, LookupFirst(NgramDrafter(target.n_vocab, 3, 2), random_eagle(target)), prompts, 10, K=3
    )
    for prompt, row in zip(prompts, out):
        assert row.tokens == autoregressive_sample(target, prompt, 10).tokens
    with pytest.raises(ValueError, match="per-row copy"):
        speculative_sample_batch(
            target, LookupFirst(NgramDrafter(target.n_vocab), EarlyExitDrafter(target, 1)), prompts, 4
        )


def test_the_costs_price_the_second_drafter_s_step(pair):
    """Where the lookup would find a match after the context, timing it would price a draft at nothing: the bar
    and K auto are about the rounds where the model drafts."""
    target, draft = pair
    then = ModelDrafter(draft)
    measure_costs(target, LookupFirst(NgramDrafter(target.n_vocab, 3, 2), then), [1, 2, 3, 1, 2], repeats=2)
    assert then.calls > 0  # the lookup would have found [1, 2] and drafted without a pass
    deeper = small_model(seed=10, n_layer=2)  # and the tree cost model's estimate without timings
    alone = draft_step_cost(EarlyExitDrafter(deeper, 1), deeper)
    assert alone > 0 and draft_step_cost(LookupFirst(NgramDrafter(6), EarlyExitDrafter(deeper, 1)), deeper) == alone


def test_the_race_leaves_out_eq_1_whose_rounds_lookup_first_does_not_have(pair):
    """Eq. 1 assumes every round drafts k tokens at one acceptance rate and cost c; lookup first mixes free looked-up
    rounds with the model's. The figures priced from the run's own rounds stay."""
    from specdec.race import race

    target, draft = pair
    report = race(
        target,
        LookupFirst(NgramDrafter(target.n_vocab, 3, 1), ModelDrafter(draft)),
        [1, 2, 3, 1, 2],
        8,
        K=2,
        repeats=1,
        warmup=False,
    )
    summary = report.explain()
    assert report.settings["lookup_first"] and summary["predicted_speedup_from_rounds"] > 0
    assert not {"predicted_speedup", "tau_expected", "best_k"} & set(summary)
    assert "predicted speedup from this run's own rounds" in str(report) and "best K" not in str(report)
    plain = race(target, ModelDrafter(draft), [1, 2, 3, 1, 2], 8, K=2, repeats=1, warmup=False)
    assert {"predicted_speedup", "tau_expected", "best_k"} <= set(plain.explain())  # the check can fail


class LooksUpWhenTheModelAgrees(LookupFirst):
    """BROKEN: draws the model's first draft, then proposes the lookup's chain only if it starts with that token
    (else the model's). The choice now depends on a draw: looked-up tokens are proposed more often where the model
    favours them, yet judged as point masses."""

    def propose(self, ids, k, params, rng, nodes=None):
        drawn = self.then.propose(ids, k, params, rng)
        found = self.lookup.propose(ids, k, params, rng)
        if len(found) and len(drawn) and found.tokens[0] == drawn.tokens[0]:
            self.looked_up += 1
            return found
        return drawn


@pytest.mark.slow
def test_choosing_by_a_draw_fails_where_choosing_by_the_text_passes():
    """The exactness argument's control: a far draft, a prompt whose tail recurs, 2 tokens at K=1, so the lookup's
    token and the draft's first draw often compete. Deciding from the text passes; deciding from the draw fails."""
    target = small_model(seed=10)
    draft, prompt = perturbed(target, 2.0, seed=3), [1, 2, 1]
    exact = exact_continuations(target, prompt, 2, T1)
    for make, should_pass in ((LookupFirst, True), (LooksUpWhenTheModelAgrees, False)):
        drafter = make(NgramDrafter(target.n_vocab, 3, 1), ModelDrafter(draft))

        def run(rng):
            return speculative_sample(target, drafter, prompt, 2, K=1, temperature=1.0, rng=rng)

        ok, stat, df = chi_square_passes(sample_many(run, n_samples=8000), exact)
        assert ok == should_pass, f"{make.__name__}: chi2={stat:.1f} df={df}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "setup",
    [
        "eagle, bar 0.3",
        "eagle, block verification",
        "eagle, tree 4",
        "medusa, bar 0.4",
        "early exit, tree 4, traversal",
    ],
)
def test_sampling_with_lookup_first_keeps_the_target_distribution_for_every_path(setup):
    """The second drafter's own chain loops (with a bar), block verification of either kind of round, and trees
    (the lookup's trie or the second drafter's tree) at T=1."""
    from test_stopping import eagle_with_stop

    target = small_model(seed=10, n_layer=2)
    exact = exact_continuations(target, [1, 2, 3], 3, T1)
    then = {
        "eagle": lambda: eagle_with_stop(target, std=0.2, bar=0.3),
        "medusa": lambda: random_medusa(target),
        "early exit": lambda: EarlyExitDrafter(target, 1),
    }[setup.split(",")[0]]()
    then.stop = ConfidenceStop(0.3 if "eagle" in setup else 0.4) if "bar" in setup else None
    drafter = LookupFirst(NgramDrafter(target.n_vocab, 3, 1), then)
    options = dict(verification="block") if "block" in setup else {}
    if "tree" in setup:
        options = dict(tree=4, verification="traversal" if "traversal" in setup else "token")

    def run(rng):
        return speculative_sample(target, drafter, [1, 2, 3], 3, K=2, temperature=1.0, rng=rng, **options)

    samples = sample_many(run, n_samples=3000)
    assert drafter.looked_up > 100, drafter.looked_up
    ok, stat, df = chi_square_passes(samples, exact)
    assert ok, f"{setup}: chi2={stat:.1f} df={df}"
