"""A chain cut by the draft's own confidence (drafters/stopping.py): where it cuts, that it leaves the
output exactly the target's at every temperature, and that the rule which reads the token it just drew
(the tempting mistake the module's NOTE describes) does not."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model
from helpers import (
    N_BROKEN,
    PROMPT,
    chi_square_passes,
    exact_continuations,
    perturbed,
    sample_many,
    small_model,
)
from test_head_drafters import random_eagle, random_medusa

from specdec import autoregressive_sample, speculative_sample, speculative_sample_batch
from specdec.drafters import EarlyExitDrafter, ModelDrafter, NgramDrafter, make_drafter
from specdec.drafters.eagle import EagleDrafter, EagleModel
from specdec.drafters.eagle_grad import init_params as eagle_init
from specdec.drafters.heads import DraftVocab
from specdec.costmodel import confidence_bar
from specdec.drafters.stopping import ConfidenceStop, parse_confidence, top_probability
from specdec.interfaces import Proposal
from specdec.sampling import SamplingParams, draw, probabilities

T1 = SamplingParams(1.0)


@pytest.fixture(scope="module")
def pair():
    """A 6-token target and a draft near it: drafts are often but not always accepted."""
    target = small_model(seed=10)
    return target, perturbed(target, 0.4, seed=3)


@pytest.fixture(scope="module")
def exact_t1(pair):
    return exact_continuations(pair[0], PROMPT, 3, T1)


@pytest.mark.parametrize("bar", [0, -0.1, 1.01, float("nan"), float("inf"), True, "0.4", None])
def test_a_bar_outside_0_1_is_refused(bar):
    with pytest.raises(ValueError, match=r"draft_confidence .* \(0, 1\]"):
        ConfidenceStop(bar)


def test_top_probability_reads_q_or_the_softmax():
    logits = np.array([2.0, 0.5, -1.0, 2.0], np.float32)
    softmax = probabilities(logits[None], T1)[0]
    assert top_probability(logits, None) == pytest.approx(float(softmax.max()), rel=1e-6)
    q = np.array([0.1, 0.7, 0.2, 0.0], np.float32)
    assert top_probability(logits, q) == pytest.approx(0.7)


def expected_length(draft, ids: list[int], tokens: list[int], bar: float) -> int:
    """Where the rule cuts a greedy chain `tokens` after `ids`, recomputed from the draft's own logits."""
    path = 1.0
    for j in range(len(tokens)):
        top = float(probabilities(draft(ids + tokens[:j])[-1:], T1)[0].max())
        if path * top < bar:
            return j
        path *= top
    return len(tokens)


@pytest.mark.parametrize("bar", [0.05, 0.3, 0.5, 0.7, 0.9])
def test_a_greedy_chain_is_cut_where_the_path_confidence_falls_below_the_bar(pair, bar):
    _, draft = pair
    greedy = SamplingParams(0.0)
    lengths = []
    for ids in ([1, 2], [3], [0, 5, 4], [2, 2, 1]):
        whole = ModelDrafter(draft).propose(ids, 4, greedy, None)
        cut = ModelDrafter(draft, stop=ConfidenceStop(bar)).propose(ids, 4, greedy, None)
        assert cut.tokens == whole.tokens[: len(cut)] and cut.is_chain  # a prefix of the uncut chain
        assert len(cut) == expected_length(draft, ids, whole.tokens, bar)
        lengths.append(len(cut))
    assert len(set(lengths)) > 1 or bar in (0.05, 0.9), f"bar {bar} cut every prompt alike: {lengths}"


def test_a_bar_that_never_cuts_draws_exactly_what_no_bar_draws(pair):
    """The rule decides before drawing: where it lets every position through, the same random numbers give the
    same drafts and the same q rows, for each drafter that takes a bar."""
    target, draft = pair
    deep = small_model(seed=10, n_layer=2)  # early exit needs a target of 2+ layers
    never = ConfidenceStop(1e-30)
    made = {
        "model": (target, lambda stop: ModelDrafter(draft, stop=stop)),
        "early exit": (deep, lambda stop: EarlyExitDrafter(deep, 1, stop=stop)),
        "medusa": (target, lambda stop: _with_stop(random_medusa(target), stop)),
        "eagle": (target, lambda stop: _with_stop(random_eagle(target), stop)),
    }
    for kind, (on, make) in made.items():
        runs = [speculative_sample(on, make(stop), PROMPT, 8, K=3, temperature=1.0, seed=4) for stop in (None, never)]
        assert runs[0].tokens == runs[1].tokens, kind
        assert runs[0].k_per_round == runs[1].k_per_round and sum(runs[0].k_per_round) > 0, kind


def _with_stop(drafter, stop):
    drafter.stop = stop
    return drafter


@pytest.mark.parametrize("kind", ["model", "early exit", "medusa", "eagle"])
def test_greedy_with_a_bar_equals_greedy_autoregressive(kind):
    """On a 6-token target where drafts are often accepted: the same tokens as plain greedy with and without the
    bar, the bar cutting rounds (at position 0 too) and leaving accepted drafts."""
    target = small_model(seed=10, n_layer=2)
    make = {
        "model": lambda stop: ModelDrafter(perturbed(target, 0.4, seed=3), stop=stop),
        "early exit": lambda stop: EarlyExitDrafter(target, 1, stop=stop),
        "medusa": lambda stop: _with_stop(random_medusa(target), stop),
        "eagle": lambda stop: _with_stop(eagle_with_stop(target, std=0.2, bar=0.5), stop),
    }[kind]
    drafted, accepted, nothing = {None: 0, 0.7: 0}, 0, 0
    for prompt in ([1, 2], [3], [0, 5, 4]):
        plain = autoregressive_sample(target, prompt, 12).tokens
        for bar in (None, 0.7):
            out = speculative_sample(target, make(bar and ConfidenceStop(bar)), prompt, 12, K=4)
            assert out.tokens == plain, (kind, prompt, bar)
            drafted[bar] += sum(out.k_per_round)
            if bar:
                accepted += out.accepted
                nothing += out.k_per_round[:-1].count(0)  # rounds cut at their first position (the last: the end)
    assert drafted[0.7] < drafted[None] and accepted > 0, (drafted, accepted)
    assert nothing > 0 or kind == "model", nothing  # this draft is sure of every first token here


# Both bars under -m slow (25 s each on 2 cores); the default suite keeps the broken control below, which runs the
# same check on a rule that cheats.
@pytest.mark.parametrize("bar", [pytest.param(0.2, marks=pytest.mark.slow), pytest.param(0.6, marks=pytest.mark.slow)])
def test_sampling_with_a_bar_keeps_the_target_distribution(pair, exact_t1, bar):
    """Bar 0.2 cuts the first round's chain at its second draft, drawn or not by the first's confidence; bar 0.6
    cuts every first round at once and the second round at its first draft, or not, by what came before."""
    target, draft = pair
    drafter = ModelDrafter(draft, stop=ConfidenceStop(bar))

    def run(rng):
        return speculative_sample(target, drafter, PROMPT, 3, K=2, temperature=1.0, rng=rng)

    rounds = round_lengths(target, drafter, 100)
    if bar == 0.2:
        firsts = [r[0] for r in rounds]
        assert all(firsts.count(n) > 10 for n in (1, 2)), f"the bar should cut some first rounds, not all: {firsts}"
    else:
        seconds = [r[1] for r in rounds if r[0] == 0]  # all of them: the first round drafts nothing
        assert len(seconds) == 100 and all(seconds.count(n) > 10 for n in (0, 1)), seconds
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=3000), exact_t1)
    assert ok, f"chi2={stat:.1f} df={df}"


def round_lengths(target, drafter, n: int) -> list[list[int]]:
    """Drafts per round in n runs of 3 tokens at K=2 (the first round asks for 2, the second for at most 1)."""
    rng = np.random.default_rng(1)
    return [speculative_sample(target, drafter, PROMPT, 3, K=2, temperature=1.0, rng=rng).k_per_round for _ in range(n)]


class KeepsWhatItDrew(ModelDrafter):
    """BROKEN: draws each token first, then drops it (and the rest of the chain) when the path confidence WITH
    the drawn token's own probability falls below the bar. The kept drafts no longer follow q, which the
    acceptance test still divides by."""

    def propose(self, ids, k, params, rng, nodes=None):
        tokens, q_rows, path, new = [], [], 1.0, ids[self.cache.length :]
        for _ in range(k):
            self.calls += 1
            q = probabilities(self.model.forward(new, self.cache, last_only=True), params)[0]
            token = draw(q, rng)
            path *= float(q[token])
            if path < self.stop.bar:
                break
            tokens.append(token)
            q_rows.append(q)
            new = [token]
        return Proposal.chain(tokens, np.stack(q_rows) if q_rows else None)


def test_a_rule_that_reads_the_token_it_drew_fails_the_same_check(pair, exact_t1):
    target, draft = pair
    broken = KeepsWhatItDrew(draft, stop=ConfidenceStop(0.2))

    def run(rng):
        return speculative_sample(target, broken, PROMPT, 3, K=2, temperature=1.0, rng=rng)

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact_t1)
    assert not ok, f"the broken rule passed (chi2={stat:.1f}, df={df})"


def eagle_with_stop(target, std: float, bar: float) -> EagleDrafter:
    """A random EAGLE head, less peaked than random_eagle's (whose q is nearly one token: never cut)."""
    params = eagle_init(target.n_embd, np.random.default_rng(0), std=std)
    model = EagleModel(params, target.n_embd, target.n_head, target.n_ctx, target.hparams.layer_norm_epsilon)
    return EagleDrafter(model, DraftVocab.of(target, None), target.weights.wte, stop=ConfidenceStop(bar))


@pytest.mark.parametrize(
    "kind",
    [pytest.param(kind, marks=pytest.mark.slow) for kind in ("medusa", "eagle", "early exit")],  # bar 0.6 above
)
def test_sampling_with_a_bar_keeps_the_target_distribution_for_every_drafter(exact_t1, pair, kind):
    """Each drafter's own chain loop (Medusa's and EAGLE's are their own code), at T=1 with a bar that cuts."""
    target, exact = pair[0], exact_t1
    if kind == "early exit":  # it needs a target of 2+ layers, with its own exact law
        target = small_model(seed=10, n_layer=2)
        drafter = EarlyExitDrafter(target, 1, stop=ConfidenceStop(0.4))
        exact = exact_continuations(target, PROMPT, 3, T1)
    elif kind == "medusa":
        drafter = _with_stop(random_medusa(target), ConfidenceStop(0.4))
    else:
        drafter = eagle_with_stop(target, std=0.2, bar=0.3)
    firsts = [r[0] for r in round_lengths(target, drafter, 100)]
    assert 0 < firsts.count(2) < len(firsts), f"the bar should cut some rounds, not all: {firsts}"

    def run(rng):
        return speculative_sample(target, drafter, PROMPT, 3, K=2, temperature=1.0, rng=rng)

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=3000), exact)
    assert ok, f"chi2={stat:.1f} df={df}"


def test_a_bar_is_refused_where_it_would_do_nothing():
    target = tiny_model(seed=1)
    with pytest.raises(ValueError, match="certain"):
        make_drafter("ngram", target, confidence=0.4)
    with pytest.raises(ValueError, match="stop=ConfidenceStop"):
        make_drafter(NgramDrafter(target.n_vocab), target, confidence=0.4)
    with pytest.raises(ValueError, match="cross_vocab"):
        make_drafter(tiny_model(seed=2), target, cross_vocab="tli", confidence=0.4)
    with pytest.raises(ValueError, match="tree is already grown"):
        speculative_sample(target, tiny_model(seed=2), [5, 6], 4, tree=4, draft_confidence=0.4)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        speculative_sample(target, tiny_model(seed=2), [5, 6], 4, draft_confidence=2)
    with pytest.raises(ValueError, match="batch"):
        speculative_sample_batch(target, ModelDrafter(tiny_model(seed=2), stop=ConfidenceStop(0.4)), [[5, 6], [7]], 4)


def test_the_cost_model_sets_the_bar_a_draft_must_clear():
    assert confidence_bar(0.03, [1.0, 1.26, 1.39]) == pytest.approx(0.29)  # a round's first draft pays above this
    assert confidence_bar(0.0, [1.0, 1.0]) == 0.001  # a free draft on a GPU-like pass: almost nothing is cut
    assert confidence_bar(0.5, [1.0, 2.0]) == 1.0  # a draft step and a row that cost more than a token earns
    assert parse_confidence("auto") == "auto" and parse_confidence("0.25") == 0.25
    with pytest.raises(ValueError, match="'auto'"):
        parse_confidence("often")


def test_auto_takes_the_bar_from_the_costs_it_measures(monkeypatch):
    from specdec import timing
    from specdec.timing import Costs

    target, seen = tiny_model(seed=1), []
    costs = Costs(target_step=0.01, draft_step=0.0005, r=[1.0, 1.4, 1.6, 1.7, 1.8])  # c = 0.05: the bar 0.45
    monkeypatch.setattr(timing, "measure_costs", lambda target, drafter, *rest, **kw: seen.append(drafter) or costs)
    out = speculative_sample(target, tiny_model(seed=2), [5, 40, 7], 12, K="auto", draft_confidence="auto")
    assert len(seen) == 1 and seen[0].stop == ConfidenceStop(0.45)  # measured once, for the bar and for K
    assert out.tokens == autoregressive_sample(target, [5, 40, 7], 12).tokens
    with pytest.raises(ValueError, match="tree is already grown"):
        speculative_sample(target, tiny_model(seed=2), [5, 6], 4, tree=4, draft_confidence="auto")


def test_the_race_prices_a_bar_s_rounds_and_nothing_else():
    from specdec.race import race

    target, draft = small_model(seed=10, n_layer=2), perturbed(small_model(seed=10, n_layer=2), 0.4, seed=3)
    report = race(target, draft, [1, 2], 10, K=4, repeats=1, warmup=False, draft_confidence=0.7)
    summary = report.explain()
    assert report.settings["draft_confidence_bar"] == 0.7 and summary["predicted_speedup_from_rounds"] > 0
    assert not {"predicted_speedup", "tau_expected", "best_k"} & set(summary)  # eq. 1 on the sure drafts' alpha
    assert "predicted speedup from this run's own rounds" in str(report) and "best K" not in str(report)
    never = race(target, draft, [1, 2], 10, K=4, repeats=1, warmup=False, draft_confidence=1.0)
    assert sum(never.spec.result.k_per_round) == 0 and never.explain()["predicted_speedup_from_rounds"] > 0
    with pytest.raises(ValueError, match="speculative"):
        race(target, draft, [1, 2], 10, decoders=("autoregressive",), draft_confidence=0.5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["model", "medusa", "eagle"])
def test_block_verification_with_a_bar_keeps_the_target_distribution(pair, exact_t1, kind):
    """Block verification (Sun et al.) of chains a bar cut: its proof needs the chain's length fixed by the drafts
    already drawn, which the bar's is."""
    target, draft = pair
    drafter = {
        "model": lambda: ModelDrafter(draft, stop=ConfidenceStop(0.2)),
        "medusa": lambda: _with_stop(random_medusa(target), ConfidenceStop(0.4)),
        "eagle": lambda: eagle_with_stop(target, std=0.2, bar=0.3),
    }[kind]()

    def run(rng):
        return speculative_sample(target, drafter, PROMPT, 3, K=2, temperature=1.0, rng=rng, verification="block")

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=3000), exact_t1)
    assert ok, f"chi2={stat:.1f} df={df}"
    if kind == "model":  # and the rule that reads the token it drew fails here too
        drafter = KeepsWhatItDrew(draft, stop=ConfidenceStop(0.2))
        ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact_t1)
        assert not ok, f"the broken rule passed block verification (chi2={stat:.1f}, df={df})"
