"""K="auto" (and draft_confidence="auto", and the race) times the costs once per target, draft and process."""

from __future__ import annotations

import pytest
from conftest import tiny_model

from specdec import speculative_sample, timing
from specdec.race import race


@pytest.fixture
def counted(monkeypatch):
    """(timings, passes): how often measure_costs ran, and every target forward pass, by call."""
    timings, real = [], timing.measure_costs
    monkeypatch.setattr(timing, "measure_costs", lambda *a, **k: timings.append(a[1]) or real(*a, **k))
    monkeypatch.delenv("SPECDEC_KERNELS", raising=False)
    return timings


def forward_passes(model) -> list:
    """Count the model's forward passes (both the round's and a timing's go through forward)."""
    calls, inner = [], model.forward
    model.forward = lambda *a, **k: calls.append(1) or inner(*a, **k)
    return calls


def test_a_second_auto_call_does_no_timing(counted, capsys):
    target, draft = tiny_model(seed=1), tiny_model(seed=2)
    passes = forward_passes(target)
    first = speculative_sample(target, draft, [5, 6, 7], 12, K="auto")
    assert len(counted) == 1 and "measuring the forward-pass costs" in capsys.readouterr().err
    assert len(passes) > first.target_calls  # the timing's passes, and the run's
    passes.clear()
    second = speculative_sample(target, draft, [8, 9, 10, 11], 12, K="auto", draft_confidence="auto")
    assert len(counted) == 1 and capsys.readouterr().err == ""
    assert len(passes) == second.target_calls  # the run's passes only: nothing timed
    report = race(target, draft, [5, 6, 7], 6, K="auto", repeats=1, warmup=False)
    assert len(counted) == 1 and report.costs is not None  # the race reports the costs it reused


def test_each_draft_and_each_target_is_timed_once(counted):
    target, other = tiny_model(seed=1), tiny_model(seed=3)
    for _ in range(2):
        speculative_sample(target, "ngram", [1, 2, 1, 2], 8, K="auto")
        speculative_sample(target, "early_exit:1", [1, 2, 1, 2], 8, K="auto")
        speculative_sample(other, "ngram", [1, 2, 1, 2], 8, K="auto")
    assert len(counted) == 3


def test_measure_times_every_call_again(counted, monkeypatch):
    target = tiny_model(seed=1)
    speculative_sample(target, "ngram", [1, 2, 1, 2], 8, K="auto")
    monkeypatch.setenv("SPECDEC_KERNELS", "measure")
    speculative_sample(target, "ngram", [1, 2, 1, 2], 8, K="auto")
    speculative_sample(target, "ngram", [1, 2, 1, 2], 8, K="auto")
    assert len(counted) == 3


def test_a_wider_pass_than_was_timed_is_timed_then(counted):
    target = tiny_model(seed=1)
    speculative_sample(target, "ngram", [1, 2, 1, 2], 8, K="auto", k_max=4)
    speculative_sample(target, "ngram", [1, 2, 1, 2], 8, K="auto", k_max=4)
    speculative_sample(target, "ngram", [1, 2, 1, 2], 8, K="auto", k_max=8)  # r(9) was never timed
    assert len(counted) == 2


def test_suffix_decoding_is_timed_only_without_an_r_of_its_own(counted):
    """A suffix drafter sizes its rounds by r(m): "suffix" (no r) times the target once per process; a drafter
    given its r keeps it and times nothing, however many drafter objects a caller makes (one per run, say); nor
    does a new lookup object per run, without an r, time the target again."""
    from specdec.drafters import NgramDrafter, SuffixDrafter

    target, flat = tiny_model(seed=1), [1.0 + 0.01 * m for m in range(40)]
    for _ in range(3):
        drafter = SuffixDrafter(target.n_vocab, r=flat)
        speculative_sample(target, drafter, [1, 2, 1, 2, 1, 2], 8, temperature=0)
        assert drafter.r is flat
    assert counted == []
    for _ in range(2):
        speculative_sample(target, "suffix:none", [1, 2, 1, 2, 1, 2], 8, temperature=0)
    assert len(counted) == 1
    for _ in range(3):  # a new drafter object per run, without an r: the target is timed once for all of them
        drafter = SuffixDrafter(target.n_vocab)
        speculative_sample(target, drafter, [1, 2, 1, 2, 1, 2], 8, temperature=0)
        assert drafter.r is not None
    assert len(counted) == 2
    speculative_sample(target, NgramDrafter(target.n_vocab), [1, 2, 1, 2], 8, K="auto")
    speculative_sample(target, NgramDrafter(target.n_vocab, n_max=2), [1, 2, 1, 2], 8, K="auto")
    assert len(counted) == 3


def test_a_wide_curve_is_timed_at_a_few_widths_and_read_between_them(monkeypatch):
    """m_max 33 (a suffix drafter's rounds): passes of 1..9, 17 and 33 tokens are timed, and r(m) between two of
    them lies on the line joining them; every r(1..33) is there for the drafter to price its rounds with. (A busy
    machine can time a tiny model's curve as implausible, which measure_costs repairs: not what is tested here.)"""
    import dataclasses

    monkeypatch.setattr(timing, "implausible", lambda r: None)

    from conftest import TINY_HPARAMS

    target = tiny_model(seed=1, hparams=dataclasses.replace(TINY_HPARAMS, n_ctx=128))
    widths = set()
    inner = target.forward
    target.forward = lambda tokens, *a, **k: widths.add(len(tokens)) or inner(tokens, *a, **k)
    costs = timing.measure_costs(target, None, [1, 2, 3, 4], m_max=33, repeats=1)
    assert widths == {3, *range(1, 10), 17, 33}  # 3: the pass over the context before the timings
    assert len(costs.r) == 33 and costs.r[0] == 1.0
    r9, r17, r33 = costs.r[8], costs.r[16], costs.r[32]
    assert costs.r[12] == pytest.approx(r9 + (r17 - r9) * 4 / 8) and costs.r[24] == pytest.approx(r17 + (r33 - r17) / 2)
    assert timing.verify_curve({1: [2.0], 3: [4.0]}) == [1.0, 1.5, 2.0]
