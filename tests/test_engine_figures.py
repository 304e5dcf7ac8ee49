"""The race's figures under the serving engines' definitions (docs/engines.md): vLLM's draft acceptance rate,
mean acceptance length and per-position acceptance, llama.cpp's accept, drafted tokens per second. Records are
built by hand, so every figure is checked against a count done here."""

import math

import numpy as np

from specdec.race import RaceReport, Run
from specdec.result import DecodeResult
from specdec.timing import Costs

# Five rounds: all 4 accepted, 1 of 4, nothing drafted (an n-gram miss), 2 of 4, 2 of 2.
K_PER_ROUND, ACCEPTED = [4, 4, 0, 4, 2], [4, 1, 0, 2, 2]


def result() -> DecodeResult:
    n = sum(ACCEPTED) + len(K_PER_ROUND)  # each round adds the target's own token
    return DecodeResult(
        tokens=list(range(n)),
        target_calls=len(K_PER_ROUND) + 1,
        k_per_round=list(K_PER_ROUND),
        accepted_per_round=list(ACCEPTED),
        k_max=4,
    )


def test_the_engines_figures_count_what_their_sources_count():
    r = result()
    # vLLM's "Avg Draft acceptance rate" and llama.cpp's "accept": every drafted token in the denominator,
    # also the ones after a rejection that were never judged (round 2's last two, round 4's last one).
    assert r.draft_acceptance_rate == 9 / 14
    assert r.alpha == 9 / 11 and r.draft_acceptance_rate < r.alpha
    # vLLM's "Mean acceptance length" and llama-server's "mean len": 1 + accepted / rounds that drafted (4 of 5).
    assert r.mean_acceptance_length == 1 + 9 / 4
    assert r.tau == 14 / 5  # tau counts the round that drafted nothing
    # vLLM's "Per-position acceptance rate": rounds whose first i drafts were all accepted / rounds that drafted.
    assert r.acceptance_by_position_per_round == [4 / 4, 3 / 4, 1 / 4, 1 / 4]
    # specdec's own per-position figure is conditional: of the rounds that judged position i.
    assert r.acceptance_by_position == [1.0, 3 / 4, 1 / 2, 1.0]


def test_nothing_drafted_gives_no_figure():
    r = DecodeResult(tokens=[1, 2], target_calls=3, k_per_round=[0, 0], accepted_per_round=[0, 0], k_max=4)
    assert math.isnan(r.draft_acceptance_rate) and math.isnan(r.mean_acceptance_length)
    assert r.acceptance_by_position_per_round == []


def test_with_every_round_drafting_k_the_two_per_position_figures_agree():
    """When every round drafts K, the unconditional rate at i is the product of the conditional rates at 1..i,
    and the mean acceptance length is tau."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        k = int(rng.integers(1, 7))
        accepted = rng.integers(0, k + 1, size=int(rng.integers(1, 12))).tolist()
        r = DecodeResult(
            tokens=list(range(sum(accepted) + len(accepted))),
            target_calls=len(accepted) + 1,
            k_per_round=[k] * len(accepted),
            accepted_per_round=accepted,
            k_max=k,
        )
        conditional = np.nan_to_num(r.acceptance_by_position, nan=0.0)
        np.testing.assert_allclose(r.acceptance_by_position_per_round, np.cumprod(conditional), atol=1e-12)
        assert math.isclose(r.mean_acceptance_length, r.tau)


def test_the_race_prints_them_and_its_json_holds_them():
    spec, ar = result(), DecodeResult(tokens=list(range(14)), target_calls=14)
    costs = Costs(target_step=0.01, draft_step=0.001, r=[1.0, 1.2, 1.4, 1.6, 1.8])
    report = RaceReport({"temperature": 0.0, "K": 4}, costs, [Run(ar, 3.0)], [Run(spec, 2.0)])
    lines = str(report).splitlines()

    def row(label: str) -> str:
        (line,) = [line for line in lines if line.startswith(label)]
        return line[len(label) :].strip()

    assert row("accepted / drafted (vLLM, llama.cpp: draft acceptance)").startswith("0.64  (9 of 14")
    assert row("1 + accepted / rounds that drafted (mean acceptance length)").startswith("3.25  (4 of 5 rounds")
    assert row("first i drafts accepted / rounds, i = 1..K (vLLM's per position)") == "1.00  0.75  0.25  0.25"
    assert row("drafted / accepted tokens per second") == "7.0 / 4.5"  # 14 and 9 drafts in 2 s
    figures = report.to_dict()["speculative"]
    assert figures["draft_acceptance_rate"] == 9 / 14 and figures["mean_acceptance_length"] == 3.25
    assert figures["acceptance_by_position_per_round"] == [1.0, 0.75, 0.25, 0.25]
    assert (figures["drafted_per_second"], figures["accepted_per_second"]) == (7.0, 4.5)
