"""The race's summary never contradicts itself: predictions from a curve that could describe a machine,
the best K next to what --K auto picked and why, the speedup labelled as the ratio it is. Records are
built by hand, so each case is exactly the one described, with no timing noise."""

import pytest

from specdec.costmodel import CostModelK, best_k, expected_tokens_per_round
from specdec.race import RaceReport, Run
from specdec.result import DecodeResult
from specdec.timing import Costs


def record(r: list[float], k_per_round: list[int], accepted_per_round: list[int], K=4, c_ratio=0.05,
           ar_tokens: int | None = None, k_policy=None) -> RaceReport:  # fmt: skip
    """A race of one repeat each: the speculative run's rounds as given, the autoregressive run making
    `ar_tokens` tokens (as many as the speculative one unless given) at a third of its speed."""
    n = sum(accepted_per_round) + len(k_per_round)
    spec = DecodeResult(tokens=list(range(n)), target_calls=len(k_per_round) + 1, k_per_round=list(k_per_round),
                        accepted_per_round=list(accepted_per_round), k_max=max(k_per_round))  # fmt: skip
    ar = DecodeResult(tokens=list(range(n if ar_tokens is None else ar_tokens)), target_calls=n)
    costs = Costs(target_step=0.01, draft_step=0.01 * c_ratio, r=list(r))
    run = Run(spec, 1.0)
    run.k_policy = k_policy
    return RaceReport({"temperature": 0.8, "K": K}, costs, [Run(ar, 3.0)], [run])


def test_a_recorded_r_below_1_is_repaired_before_any_prediction_and_said():
    """r(2) = 0.6 prices a 2-token pass under a 1-token step: with alpha 1 it made K=1 look 3.1x faster.
    The predictions use the curve raised to at least 1, and a NOTE says so."""
    report = record([1.0, 0.6, 1.3, 1.5, 1.7], [4] * 5, [4] * 5)  # alpha 1
    summary, text = report.explain(), str(report)
    k, speedup, c = summary["best_k"], summary["best_k_speedup"], report.costs.c
    # No pass is cheaper than a step: the best K's speedup is at most what r(k + 1) = 1 would give.
    assert speedup <= expected_tokens_per_round(1.0, k) / (k * c + 1.0) + 1e-9
    assert (k, speedup) == best_k(1.0, c, [1.0, 1.0, 1.3, 1.5, 1.7], k_max=4) and k == 4
    assert summary["verify_cost_ratio"] >= 1
    assert "NOTE: the recorded r(m) is implausible (r(2) = 0.60 is below 1" in text
    # A plausible curve is used as recorded, with no NOTE.
    fine = record([1.0, 1.1, 1.3, 1.5, 1.7], [4] * 5, [4] * 5)
    assert "implausible" not in str(fine) and fine.curve() == ([1.0, 1.1, 1.3, 1.5, 1.7], None)


def test_the_auto_policy_and_the_best_k_are_shown_side_by_side_with_why_they_differ():
    """--K auto picks k each round with best_k on its own running alpha (a prior of 0.6, decaying); the
    summary's best K uses the run's alpha. With every draft accepted over a short run they differ (K=1
    or 2 against K=8): the summary shows the policy's alpha and K next to the best K, computed the same way."""
    c, r = 0.009, [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]  # a steep CPU curve
    policy = CostModelK(c, r, k_max=8)
    ks = []
    for _ in range(5):  # every draft accepted, as the policy asks
        ks.append(policy.next_k())
        policy.update(ks[-1], ks[-1])
    report = record(r, ks, ks, K="auto", c_ratio=c, k_policy=policy)
    summary, text = report.explain(), str(report)
    assert summary["alpha"] == 1.0 and summary["best_k"] == 8  # hindsight: this run's alpha
    assert ks == [1] * 5  # what the policy picked (from alpha 0.60 .. 0.76)
    auto_k = summary["auto_k"]
    assert auto_k == policy.next_k() == best_k(policy.alpha, c, r, k_max=8)[0] < 8  # its next pick, by the same formula
    assert summary["auto_alpha"] == pytest.approx(policy.alpha) and policy.alpha < 0.8
    row = next(line for line in text.splitlines() if line.startswith("--K auto: its running alpha -> its K"))
    assert f"{policy.alpha:.2f} -> {auto_k}" in row and "starts at 0.60" in row and "lags the alpha above" in row
    assert report.to_dict()["summary"]["auto_k"] == auto_k
    # A fixed K has no such row.
    assert "--K auto" not in str(record(r, [4] * 5, [4] * 5))


def test_the_speedup_is_labelled_as_the_ratio_it_is():
    """Runs of different lengths (a chat reply ending early, sampling) compare rates, not times."""
    same = record([1.0, 1.1, 1.3, 1.5, 1.7], [4] * 5, [2] * 5)
    assert "speedup (autoregressive time / speculative time)" in str(same)
    assert same.to_dict()["summary"]["speedup_is"] == "autoregressive time / speculative time"
    shorter = record([1.0, 1.1, 1.3, 1.5, 1.7], [4] * 5, [2] * 5, ar_tokens=30)  # 15 speculative tokens
    text = str(shorter)
    assert "speedup (speculative tokens/s / autoregressive tokens/s)" in text and "time / speculative time" not in text
    assert "rates, as the two decoders made different numbers of tokens" in text
    assert shorter.to_dict()["summary"]["speedup_is"] == "speculative tokens/s / autoregressive tokens/s"
    assert shorter.speedup == pytest.approx((15 / 1.0) / (30 / 3.0))  # the rates' ratio, not 3.0 / 1.0
    assert "time / speculative time" not in shorter._repr_html_()


def test_a_tree_race_is_priced_by_the_cost_models_own_reading_of_r():
    """A tree's mean node count is fractional (2.5 nodes a round): the race reads r(m) between measured points
    as costmodel.verify_cost does, the one reading of a curve, and predicts with predicted_tree_speedup."""
    from specdec.costmodel import predicted_tree_speedup, verify_cost

    report = record([1.0, 1.2, 1.6, 2.0], [2, 3, 2, 3], [1, 2, 0, 3])
    report.settings["tree"] = 3
    summary, r = report.explain(), report.costs.r
    assert summary["mean_nodes"] == 2.5 and verify_cost(3.5, r) == pytest.approx(1.8)
    assert summary["tree_verify_cost_ratio"] == verify_cost(3.5, r)
    passes = summary["draft_passes_per_round"]
    assert summary["tree_predicted_speedup"] == predicted_tree_speedup(summary["tau"], 2.5, report.costs.c * passes, r)
