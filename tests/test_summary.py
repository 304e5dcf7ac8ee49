"""The race's summary never contradicts itself: predictions from a curve that could describe a machine,
the best K next to what --K auto picked and why, the speedup labelled as the ratio it is. Records are
built by hand, so each case is exactly the one described, with no timing noise."""

import pytest

from specdec.costmodel import CostModelK, best_k, expected_tokens_per_round
from specdec.race import RaceReport, Run
from specdec.result import DecodeResult
from specdec.timing import Costs


def record(
    r: list[float],
    k_per_round: list[int],
    accepted_per_round: list[int],
    K=4,
    c_ratio=0.05,
    ar_tokens: int | None = None,
    k_policy=None,
) -> RaceReport:
    """A race of one repeat each: the speculative run's rounds as given, the autoregressive run making
    `ar_tokens` tokens (as many as the speculative one unless given) at a third of its speed."""
    n = sum(accepted_per_round) + len(k_per_round)
    spec = DecodeResult(
        tokens=list(range(n)),
        target_calls=len(k_per_round) + 1,
        k_per_round=list(k_per_round),
        accepted_per_round=list(accepted_per_round),
        k_max=max(k_per_round),
    )
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


def sparse_drafting_record(ar_seconds: list[float], spec_seconds: list[float]) -> RaceReport:
    """A run priced over its own rounds (a draft confidence bar: eq. 1 left out) that drafted 4 tokens in 36 rounds
    of 40 tokens, with one draft pass a round: its passes allow at most about 1.07x over plain decoding."""
    k = [1] * 4 + [0] * 32  # drafts per round, every one accepted
    spec = DecodeResult(list(range(40)), target_calls=37, draft_calls=36, k_per_round=k, accepted_per_round=k, k_max=4)
    ar = DecodeResult(tokens=list(range(40)), target_calls=40)
    costs = Costs(target_step=0.02, draft_step=0.0004, r=[1.0, 1.13, 1.2, 1.3, 1.4])
    settings = {"temperature": 0.0, "K": 4, "draft_confidence": "auto", "draft_confidence_bar": 0.15}
    runs = lambda result, seconds: [Run(result, s) for s in seconds]  # noqa: E731
    return RaceReport(settings, costs, runs(ar, ar_seconds), runs(spec, spec_seconds))


def test_a_speedup_above_what_the_passes_allow_is_called_noise_with_the_bound():
    """Measured 1.64x where 36 verification passes and 36 draft steps for 40 tokens allow at most 1.07x: the
    verdict is noise, never "faster", and the row gives the bound; the bound is the cost model's count."""
    report = sparse_drafting_record([4.39, 4.2, 4.5], [2.68, 2.6, 2.9])
    c, r = report.costs.c, report.costs.r
    steps = 36 * c + 32 * r[0] + 4 * r[1]  # draft steps at c, then a pass over k + 1 tokens a round
    assert report.passes_bound == pytest.approx(40 / steps) and 1.06 < report.passes_bound < 1.08
    assert report.speedup == pytest.approx(4.39 / 2.68) and report.verdict == "noise"
    rows = {line.split("  ")[0]: line for line in str(report).splitlines()}
    verdict = next(line for key, line in rows.items() if key.startswith("verdict"))
    assert "noise  (1.64x is more than these passes allow, at most 1.07x: 40 tokens for 36 verification" in verdict
    assert "faster" not in str(report)
    summary = report.to_dict()["summary"]
    assert summary["verdict"] == "noise" and summary["passes_bound"] == pytest.approx(40 / steps)
    # Within the margin of what the passes allow, the usual verdict stands: 1.25x is not above 1.07x * 1.2.
    assert sparse_drafting_record([1.25] * 3, [1.0] * 3).verdict == "faster"
    assert sparse_drafting_record([1.05] * 3, [1.0] * 3).verdict == "within noise"


def test_measured_far_below_the_rounds_prediction_is_noted_where_eq_1_is_left_out():
    """The summary of a run with a draft confidence bar prices only its own rounds (no eq. 1 prediction): the
    note that measured and predicted differ must still fire against that prediction."""
    report = sparse_drafting_record([1.0] * 3, [2.0] * 3)  # measured 0.5x against 1.07x predicted
    assert report.rounds_only and "predicted_speedup" not in report.explain()
    assert "NOTE: the measured and predicted speedups differ by more than 1.5x" in str(report)
    assert "differ by more than" not in str(sparse_drafting_record([1.0] * 3, [1.0] * 3))  # 1.0x: near enough


def test_the_speedup_is_the_ratio_of_the_two_medians_printed_above_it():
    """Repeats of 1, 2 and 3 s against 3, 1 and 2 s: the median of the per-repeat ratios is 1.5x, while the two
    medians printed above the summary are 2.00 s and 2.00 s. The line prints the figure a reader can check
    (1.00x, the ratio of those two), says so, and keeps the repeats' spread beside it."""
    report = record([1.0, 1.1, 1.3, 1.5, 1.7], [4] * 5, [2] * 5)
    ar, spec = report.autoregressive[0].result, report.speculative[0].result
    report.autoregressive = [Run(ar, s) for s in (1.0, 2.0, 3.0)]
    report.speculative = [Run(spec, s) for s in (3.0, 1.0, 2.0)]
    text = str(report)
    times = [float(line.split(" in ")[1].split(" s ")[0]) for line in text.splitlines() if " tokens in " in line[:30]]
    row = next(line for line in text.splitlines() if line.startswith("speedup ("))
    assert times == [2.0, 2.0] and report.speedup == pytest.approx(times[0] / times[1]) and "1.00x  (" in row
    assert "(2.00 s / 2.00 s, the medians above; each repeat's own ratio 0.33x .. 2.00x)" in row
    assert sorted(report.speedups) == pytest.approx([1 / 3, 1.5, 2.0])  # the median of these would say 1.50x
