"""Honest noise: the race's verdict (median speedup against a margin of 20% or the measured spread), the
interleaved, alternating repeats, and measure_costs re-measuring an implausible r(m) before anything uses it."""

import inspect

import numpy as np
import pytest
from conftest import tiny_model
from helpers import perturbed

from specdec import timing
from specdec.race import NOISE_FLOOR, RaceReport, Run, race
from specdec.result import DecodeResult
from specdec.timing import Costs, implausible, measure_costs, plausible


def report_with(ar_seconds: list[float], spec_seconds: list[float]) -> RaceReport:
    tokens = list(range(10))
    ar = [Run(DecodeResult(tokens=tokens, target_calls=10), s) for s in ar_seconds]
    # Two rounds accepting all 4 drafts: 10 tokens for 2 passes over 5 tokens (and 2 lookups), at most 3.3x.
    spec = [
        Run(DecodeResult(tokens=tokens, target_calls=3, k_per_round=[4] * 2, accepted_per_round=[4, 4], k_max=4), s)
        for s in spec_seconds
    ]
    return RaceReport({"temperature": 0.0, "K": 4}, Costs(0.01, 0.001, [1.0, 1.1, 1.2, 1.3, 1.4]), ar, spec)


def test_the_verdict_is_the_median_against_the_margin():
    assert report_with([1.0] * 3, [0.5] * 3).verdict == "faster"  # 2x, no spread
    assert report_with([1.0] * 3, [2.0] * 3).verdict == "slower"  # 0.5x
    assert report_with([1.0] * 3, [0.9] * 3).verdict == "within noise"  # 1.11x < 1 + 20%
    r = report_with([1.0, 1.0, 1.0], [1 / 1.3, 1 / 0.9, 1 / 2.0])  # speedups 1.3, 0.9, 2.0: median 1.3
    assert r.speedup == pytest.approx(1.3) and r.spread == pytest.approx((0.9, 2.0))
    assert r.margin == pytest.approx(1.1 / 1.3) and r.verdict == "within noise"  # the spread is the margin
    assert report_with([1.0], [1 / 1.25]).margin == NOISE_FLOOR  # one repeat: the floor
    assert report_with([1.0], [1 / 1.25]).verdict == "faster"


def test_the_verdict_does_not_flip_between_runs_that_differ_by_noise():
    """Repeats whose speedups scatter by up to the floor around a true speedup give one verdict, across many
    simulated 'identical runs'; a verdict without the margin (median > 1) flips on the same runs."""
    rng = np.random.default_rng(0)
    for true in (1.05, 1.6, 0.6):
        verdicts, naive = set(), set()
        for _ in range(200):
            speedups = true * np.exp(rng.uniform(-0.08, 0.08, 3))  # +-8% per repeat
            r = report_with([1.0] * 3, list(1 / speedups))
            verdicts.add(r.verdict)
            naive.add("faster" if r.speedup > 1 else "slower")
        assert len(verdicts) == 1, (true, verdicts)
        assert true != 1.05 or len(naive) == 2  # the broken rule flips near 1x


def test_the_summary_states_speedup_spread_verdict_and_prediction():
    text = str(report_with([1.0, 1.1, 1.2], [0.5, 0.52, 0.61]))
    assert "(1.10 s / 0.52 s, the medians above; each repeat's own ratio 1.97x .. 2.12x)" in text
    assert "verdict (margin ±20%: 20% or the spread)" in text and "faster  (above 1.20x)" in text
    assert "predicted by the cost model" in text
    d = report_with([1.0, 1.1, 1.2], [0.5, 0.52, 0.61]).to_dict()["summary"]
    assert d["verdict"] == "faster" and len(d["speedups"]) == 3 and d["margin"] == NOISE_FLOOR


def test_repeats_are_interleaved_and_alternate():
    target = tiny_model(seed=1)
    order = []
    report = race(
        target, perturbed(target, 0.05, seed=4), [1, 2, 3], 6, K=2, repeats=4, warmup=False, on_decoder=order.append
    )
    assert len(report.autoregressive) == len(report.speculative) == len(report.speedups) == 4
    assert order == ["autoregressive", "speculative"]  # streamed: the first repeat only
    assert inspect.signature(race).parameters["repeats"].default == 3


def test_implausible_curves():
    assert implausible([1.0, 1.1, 1.3, 1.6, 2.0]) is None
    assert "r(8) = 20.0 is above 8" in implausible([1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 20.0])
    assert "a longer pass cost less" in implausible([1.0, 1.2, 3.0, 1.5])
    assert "r(2) = 0.90 is below 1: one pass over 2 tokens cost less than a 1-token step" in implausible(
        [1.0, 0.9, 1.3]
    )
    assert "r(3) = 0.95 is below 1" in implausible([1.0, 1.0, 0.95])
    assert plausible([1.0, 0.9, 1.3]) == [1.0, 1.0, 1.3]
    assert plausible([1.0, 5.0, 1.5, 9.0]) == [1.0, 2.0, 2.0, 4.0]
    assert implausible(plausible([1.0, 5.0, 1.5, 9.0])) is None


def test_measure_costs_measures_again_before_using_an_implausible_curve(monkeypatch):
    target = tiny_model(seed=1)
    curves = [[1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 20.0, 31.5], [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]]
    repeats = []

    def fake(calls, after, n, rng):
        repeats.append(n)
        return Costs(0.01, 0.001, list(curves[min(len(repeats) - 1, len(curves) - 1)]))

    monkeypatch.setattr(timing, "_measure", fake)
    costs = measure_costs(target, None, [1, 2], repeats=3)
    assert (
        repeats == [3, 6]
        and costs.r == curves[1]
        and "measured again, as the first measurement was implausible (r(8) = 20.0" in costs.note
    )
    # always implausible: used only once repaired, and said
    curves[1] = curves[0]
    repeats.clear()
    costs = measure_costs(target, None, [1, 2], repeats=3)
    assert repeats == [3, 6, 12] and implausible(costs.r) is None and "stayed implausible" in costs.note


def test_measure_costs_measures_again_when_a_pass_cost_less_than_a_step(monkeypatch):
    """r(2) = 0.9 would price a 2-token pass under a 1-token step: measured again, and repaired if it stays."""
    curves = [[1.0, 0.9, 1.3, 1.5], [1.0, 1.2, 1.3, 1.5]]
    repeats = []

    def fake(calls, after, n, rng):
        repeats.append(n)
        return Costs(0.01, 0.001, list(curves[min(len(repeats) - 1, len(curves) - 1)]))

    monkeypatch.setattr(timing, "_measure", fake)
    costs = measure_costs(tiny_model(seed=1), None, [1, 2], m_max=4, repeats=3)
    assert repeats == [3, 6] and costs.r == curves[1] and "(r(2) = 0.90 is below 1" in costs.note
    curves[1] = curves[0]
    repeats.clear()
    costs = measure_costs(tiny_model(seed=1), None, [1, 2], m_max=4, repeats=3)
    assert repeats == [3, 6, 12] and costs.r == [1.0, 1.0, 1.3, 1.5] and "raised to at least 1" in costs.note
