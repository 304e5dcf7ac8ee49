"""Trees through the whole round: speculative_sample(..., tree=N | "auto") with every drafter.

Greedy trees emit greedy autoregressive text; sampled trees emit the target's
distribution (chi-square, with a broken rule that must fail); a chain is a tree
of width 1; both caches hold exactly the accepted text after every round.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_model
from helpers import (
    N_BROKEN,
    N_SAMPLES,
    assert_cache_holds,
    chi_square_passes,
    exact_continuations,
    perturbed,
    sample_many,
    small_model,
)
from test_tree_rules import verify_residual_not_updated

import specdec.verify as verify_module
from specdec import autoregressive_sample, speculative_sample
from specdec.costmodel import TreeAcceptance, TreePolicy
from specdec.drafters import EarlyExitDrafter, ModelDrafter, NgramDrafter
from specdec.sampling import SamplingParams

NEAR_TIE = 1e-4  # logit gap below which float32 rounding may pick either token


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1)


def drafters(target):
    """Fresh drafters of every kind, each able to branch."""
    return {
        "model": ModelDrafter(perturbed(target, 0.05, seed=3)),
        "model, width 3": ModelDrafter(perturbed(target, 0.3, seed=4), tree_width=3),
        "early exit": EarlyExitDrafter(target, n_layer=1),
        "ngram": NgramDrafter(target.n_vocab, n_max=2),
    }


def first_difference_is_a_near_tie(target, prompt, expected, got) -> tuple[bool, str]:
    """At the first differing token: is the target's top-2 logit gap below NEAR_TIE?"""
    i = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)
    logits = target.forward(prompt + expected[:i], target.new_cache(), last_only=True)[0]
    top2 = np.sort(logits)[-2:]
    gap = float(top2[1] - top2[0])
    return gap < NEAR_TIE, f"token {i}: {expected[i]} vs {got[i]}, top-2 logit gap {gap:.2e}"


@pytest.mark.parametrize("tree", [1, 3, pytest.param(8, marks=pytest.mark.slow), 16, "auto"])
def test_greedy_tree_equals_greedy_autoregressive(target, tree):
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, target.n_vocab, size=n))) for n in (1, 4, 11)]
    prompts.append([7, 8, 9, 7, 8, 9, 7, 8, 5, 7, 8, 6, 7, 8])  # repeats with several continuations
    accepted, near_ties = {}, []
    for prompt in prompts:
        expected = autoregressive_sample(target, prompt, 24).tokens
        for name, drafter in drafters(target).items():
            for K in (1, 3, 5):
                out = speculative_sample(target, drafter, prompt, 24, K=K, tree=tree)
                if out.tokens != expected:
                    tie, where = first_difference_is_a_near_tie(target, prompt, expected, out.tokens)
                    assert tie, f"draft={name} K={K} tree={tree} prompt={prompt}: {where}"
                    near_ties.append(f"draft={name} K={K}: {where}")
                accepted[name] = accepted.get(name, 0) + out.accepted
    assert all(accepted.values()), accepted
    if near_ties:  # detected, and reported rather than hidden
        pytest.xfail("float32 near-ties changed the greedy token: " + "; ".join(near_ties))


def test_trees_branch_and_accept_more_per_pass(target):
    prompt = [7, 8, 9, 7, 8, 9, 7, 8, 5, 7, 8, 6, 7, 8, 5, 7, 8, 6]
    chain = speculative_sample(target, "ngram", prompt, 40, K=4)
    tree = speculative_sample(target, "ngram", prompt, 40, K=4, tree=8)
    assert tree.tokens == chain.tokens
    assert tree.drafted > chain.drafted and tree.tau >= chain.tau
    assert len(tree.acceptance_by_position) == 4 and all(0 <= a <= 1 for a in tree.acceptance_by_position[:2])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["model", "early exit"])
def test_a_chain_is_a_tree_of_width_one(target, kind, temperature):
    """Asked for a tree of width 1, a model drafter grows a chain: token for token the chain's output."""
    prompt = [7, 8, 9, 7, 8, 9, 7, 8, 2, 3]
    draft = perturbed(target, 0.1, seed=5)

    def drafter(width):
        return ModelDrafter(draft, tree_width=width) if kind == "model" else EarlyExitDrafter(target, 1, width)

    for seed in range(4):
        chain = speculative_sample(target, drafter(2), prompt, 30, K=4, temperature=temperature, seed=seed)
        tree = speculative_sample(target, drafter(1), prompt, 30, K=4, temperature=temperature, seed=seed, tree=4)
        assert tree.tokens == chain.tokens and tree.k_per_round == chain.k_per_round
        assert tree.accepted_per_round == chain.accepted_per_round
        assert chain.accepted > 0


@pytest.mark.parametrize("kind", ["model", "early exit"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_hold_exactly_the_accepted_text_after_each_tree_round(target, kind, temperature):
    drafter = drafters(target)[kind]
    prompt, emitted, rounds = [5, 6, 7], [], []
    real_begin, real_commit = drafter.begin, drafter.commit

    def recording_begin(target_model, cache, prompt_ids):
        rounds.append(cache)
        real_begin(target_model, cache, prompt_ids)

    def checking_commit(ids, features):
        real_commit(ids, features)
        text = prompt + emitted
        assert list(ids) == text and rounds[0].length == len(text) - 1
        assert_cache_holds(target, rounds[0], text)
        if kind == "model":
            assert_cache_holds(drafter.model, drafter.cache, text)  # a prefix of the text, no tree node
        rounds.append(len(features))

    drafter.begin, drafter.commit = recording_begin, checking_commit
    out = speculative_sample(
        target,
        drafter,
        prompt,
        30,
        K=3,
        temperature=temperature,
        seed=2,
        tree=6,
        on_token=lambda token, kind: emitted.append(token),
    )
    assert rounds[2:] == [n + 1 for n in out.accepted_per_round]
    assert max(out.k_per_round) > 3, "trees wider than chains were drafted"
    assert out.accepted > 0 and (temperature > 0 or out.accepted < out.drafted)


# --- exactness through the round -------------------------------------------------------------

PROMPT = [1, 2, 1, 2, 3, 1, 2]  # repeats: the n-gram trie has something to propose


@pytest.mark.parametrize(
    "kind,params",
    [
        pytest.param("model", SamplingParams(1.0), marks=pytest.mark.slow),
        # -m slow runs every drafter; the default suite judges point-mass trees through the round in the suffix
        # drafter's quick check (tests/drafters/test_suffix_drafter.py)
        pytest.param("ngram", SamplingParams(1.0), marks=pytest.mark.slow),
        pytest.param("early exit", SamplingParams(1.0), marks=pytest.mark.slow),
        pytest.param("model", SamplingParams(1.5, top_k=3), marks=pytest.mark.slow),
        pytest.param("model", SamplingParams(1.5, top_p=0.7), marks=pytest.mark.slow),
        pytest.param("ngram", SamplingParams(0.7, top_k=4), marks=pytest.mark.slow),
    ],
    ids=["model", "ngram", "early_exit", "model-top_k", "model-top_p", "ngram-top_k"],
)
def test_sampled_trees_keep_the_target_distribution(kind, params, monkeypatch):
    model = small_model(seed=11, n_layer=2)
    draft = perturbed(model, 0.3, seed=6)
    exact = exact_continuations(model, PROMPT, 3, params)

    def run(rng):
        drafter = {
            "model": ModelDrafter(draft, tree_width=2),
            "ngram": NgramDrafter(model.n_vocab, n_max=2),
            "early exit": EarlyExitDrafter(model, n_layer=1, tree_width=2),
        }[kind]
        return speculative_sample(
            model,
            drafter,
            PROMPT,
            3,
            K=2,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            rng=rng,
            tree=5,
        )

    out = run(np.random.default_rng(0))
    assert out.drafted > 2, "the round should draft trees"
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_SAMPLES // 2), exact)
    assert ok, f"{kind}: chi2={stat:.1f} df={df}"
    if kind == "model" and params.top_k is None and params.top_p is None:
        monkeypatch.setattr(verify_module, "sampled_tree", verify_residual_not_updated)
        ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact)
        assert not ok, f"the broken rule passed through the round (chi2={stat:.1f}, df={df})"


@pytest.mark.slow
def test_typical_acceptance_is_lossy_and_opt_in(target):
    model = small_model(seed=11, n_layer=2)
    draft = perturbed(model, 0.3, seed=6)
    exact = exact_continuations(model, PROMPT, 3, SamplingParams(1.0))

    def run(rng):
        return speculative_sample(model, draft, PROMPT, 3, K=2, temperature=1.0, rng=rng, tree=5, acceptance="typical")

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact)
    assert not ok, f"typical acceptance passed the exactness check (chi2={stat:.1f}, df={df})"
    with pytest.raises(ValueError, match="acceptance"):
        speculative_sample(model, draft, PROMPT, 3, acceptance="medusa")


def test_tree_auto_learns_and_reports(target):
    policy = TreePolicy(c=0.0, r=[1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6], n_max=8)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8, 5, 7, 8, 6, 7, 8]
    out = speculative_sample(target, "ngram", prompt, 40, K=4, tree=policy)
    assert out.tokens == autoregressive_sample(target, prompt, 40).tokens
    assert not np.allclose(policy.acceptance.rates, TreeAcceptance().rates)  # it learned from the rounds
    auto = speculative_sample(target, target, prompt, 20, K=3, tree="auto")  # c and r by default
    assert auto.tokens == autoregressive_sample(target, prompt, 20).tokens
    assert auto.tau == pytest.approx((auto.accepted + auto.rounds) / auto.rounds)


# --- main.py --tree ---------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["6", "auto"])
def test_cli_tree(tmp_path, capsys, tree):
    import sys

    from conftest import ROOT, write_checkpoint

    sys.path.insert(0, str(ROOT))
    from specdec.cli import main

    target = tiny_model(seed=1)
    write_checkpoint(tmp_path / "target", target)
    write_checkpoint(tmp_path / "draft", perturbed(target, 0.05, seed=4))
    argv = [
        "--target_model_size",
        str(tmp_path / "target"),
        "--draft",
        str(tmp_path / "draft"),
        "--prompt",
        "the cat in the hat",
        "--n_tokens_to_generate",
        "20",
        "--K",
        "3",
        "--tree",
        tree,
    ]
    assert main.main(argv) == 0
    out = capsys.readouterr().out
    assert f"tree={tree}" in out and "tau (tokens per round = per target pass)" in out
    assert "acceptance at depth 1..K" in out and "predicted speedup tau / (c * passes + r(nodes + 1))" in out
    assert out.split("identical text at temperature 0")[1].split()[0] == "yes"
    assert main.main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["tau"] >= 1 and summary["mean_nodes"] >= (3 if tree == "6" else 1)
    assert len(summary["depth_acceptance"]) <= 3
    with pytest.raises(SystemExit) as e:
        main.main([*argv[:-1], "wide"])
    assert e.value.code == 2 and "--tree must be" in capsys.readouterr().err
