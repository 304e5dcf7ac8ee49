"""specdec.bench.plot: the data behind each plot (no matplotlib needed), then the figures
themselves when matplotlib is installed (`pip install -e '.[notebook]'`)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from conftest import tiny_model

from specdec import speculative_sample
from specdec.bench import plot
from specdec.costmodel import drafts_judged, predicted_speedup


@pytest.fixture(scope="module")
def sampled_run():
    """A real speculative run with rejections at several positions (two unrelated tiny models)."""
    target, draft = tiny_model(seed=0), tiny_model(seed=1)
    return speculative_sample(target, draft, [1, 2, 3], n_tokens=40, K=4, temperature=1.0, seed=3)


# ---------------------------------------------------------------------------
# Data functions.
# ---------------------------------------------------------------------------


def test_acceptance_by_position_by_hand():
    # Rounds: k=3 all accepted; k=3 one accepted (positions 1, 2 judged); k=0 (no drafts);
    # k=2 none accepted (position 1 judged); k=1 accepted.
    rate, tested = plot.acceptance_by_position(([3, 3, 0, 2, 1], [3, 1, 0, 0, 1]))
    assert tested.tolist() == [4, 2, 1]
    np.testing.assert_allclose(rate, [3 / 4, 1 / 2, 1 / 1])
    rate, tested = plot.acceptance_by_position(([2], [0]))
    assert tested.tolist() == [1, 0] and rate[0] == 0 and math.isnan(rate[1])  # position 2 never judged
    with pytest.raises(AssertionError):
        plot.acceptance_by_position(([2], [3]))


def test_acceptance_by_position_agrees_with_the_run(sampled_run):
    res = sampled_run
    rate, tested = plot.acceptance_by_position(res)
    judged = sum(drafts_judged(k, n) for k, n in zip(res.k_per_round, res.accepted_per_round) if k)
    assert tested.sum() == judged
    assert tested[0] == sum(1 for k in res.k_per_round if k > 0)  # every drafting round judges position 1
    assert np.nansum(rate * tested) == pytest.approx(res.accepted)
    assert np.all(np.diff(tested) <= 0)  # later positions are reached no more often
    assert 0 < res.accepted < res.drafted  # the run has both outcomes, so the checks above bite


def test_accepted_histogram_matches_the_result(sampled_run):
    counts = plot.accepted_histogram(sampled_run)
    assert counts.tolist() == list(sampled_run.accepted_histogram)
    assert plot.accepted_histogram(([0, 2, 2], [0, 2, 1])).tolist() == [1, 1, 1]  # a round drafting nothing: 0
    assert plot.accepted_histogram(sampled_run).sum() == sampled_run.rounds


def test_speedup_grid_is_the_cost_model():
    r = [1.0, 1.4, 1.9, 2.5, 3.2, 4.0]
    alphas, grid = plot.speedup_grid(0.1, r, ks=[1, 3, 5], alphas=[0.2, 0.8])
    assert grid.shape == (3, 2)
    assert grid[1, 1] == pytest.approx(predicted_speedup(0.8, 3, 0.1, r))
    alphas, grid = plot.speedup_grid(0.0, None, ks=[1, 2, 8])  # free drafts, r = 1: longer K always wins
    assert np.all(np.diff(grid[:, -1]) > 0) and np.allclose(grid[:, 0], 1.0)


def test_verify_costs_checks_its_input():
    m, r = plot.verify_costs([1.0, 1.5, 2.0])
    assert m.tolist() == [1, 2, 3] and r.tolist() == [1.0, 1.5, 2.0]
    for bad in ([], [2.0, 3.0], [[1.0]]):
        with pytest.raises(ValueError, match="r\\(1\\) = 1"):
            plot.verify_costs(bad)


def test_tree_vs_chain_aligns_metrics():
    shapes, metrics, values = plot.tree_vs_chain({"chain": {"tau": 2.0, "speedup": 1.2}, "tree": {"tau": 3.0}})
    assert shapes == ["chain", "tree"] and metrics == ["tau", "speedup"]
    assert values[0].tolist() == [2.0, 1.2] and values[1, 0] == 3.0 and math.isnan(values[1, 1])
    with pytest.raises(ValueError):
        plot.tree_vs_chain({})


def test_predicted_vs_measured_drops_runs_without_a_prediction():
    rows = plot.predicted_vs_measured(
        {"a": (1.5, 1.2), "b": {"predicted_speedup": 2.0, "measured_speedup": 1.8}, "c": {"measured_speedup": 1.0}}
    )
    assert rows == [("a", 1.5, 1.2), ("b", 2.0, 1.8)]


def test_acceptance_test_numbers():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.6, 0.0, 0.3])
    d = plot.acceptance_test(p, q, drafted=3, top=2)
    assert 3 in d["tokens"] and len(d["tokens"]) == 2  # the drafted token is shown even outside the top
    assert d["accept_probability"] == 0.0  # p(3) = 0
    d = plot.acceptance_test(p, q, drafted=1, top=4)
    assert d["accept_probability"] == pytest.approx(0.5)  # min(1, 0.3 / 0.6)
    assert d["overlap"] == pytest.approx(0.1 + 0.3)  # sum min(p, q)
    residual = dict(zip(d["tokens"], d["residual"]))  # max(0, p - q) = [0.4, 0, 0.2, 0] / 0.6
    assert residual[0] == pytest.approx(0.4 / 0.6) and residual[2] == pytest.approx(0.2 / 0.6)
    assert residual[1] == residual[3] == 0
    with pytest.raises(ValueError):
        plot.acceptance_test(p, q[:3], drafted=0)


def test_missing_matplotlib_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[notebook\]'"):
        plot.plot_accepted_histogram(([2, 2], [1, 2]))


# ---------------------------------------------------------------------------
# Figures (need matplotlib).
# ---------------------------------------------------------------------------


@pytest.fixture
def mpl():
    return pytest.importorskip("matplotlib")


def only_axes(fig):
    assert type(fig).__name__ == "Figure" and len(fig.axes) == 1
    return fig.axes[0]


def test_figures_draw_one_mark_per_number(mpl, sampled_run):
    k = max(sampled_run.k_per_round)
    ax = only_axes(plot.plot_acceptance_by_position({"a": sampled_run, "b": ([2, 2], [2, 0])}))
    assert len(ax.patches) == k + 2  # one bar per position each run drafted
    assert len(ax.lines) == 2  # one alpha line per run

    ax = only_axes(plot.plot_accepted_histogram(sampled_run, alpha=0.5))
    assert len(ax.patches) == k + 1 and len(ax.lines) == 1

    ax = only_axes(plot.plot_speedup_grid(0.2, [1.0, 1.3, 1.7, 2.2, 2.8], ks=[1, 2, 4], measured=(0.6, 1.1)))
    assert len(ax.lines) == 3 + 1 + 1 + 1  # one per K, the best-K envelope, the measured star, y = 1

    ax = only_axes(plot.plot_verify_costs({"124M": [1.0, 1.2, 1.5], "355M": [1.0, 1.1, 1.3, 1.6]}))
    assert len(ax.lines) == 2 + 2 and ax.lines[2].get_xdata().tolist() == [1, 2, 3, 4]

    ax = only_axes(plot.plot_tree_vs_chain({"chain": {"tau": 2.0, "speedup": 1.2}, "tree": {"tau": 3.0, "x": 1}}))
    assert len(ax.patches) == 2 * 3

    ax = only_axes(plot.plot_predicted_vs_measured({"a": (1.5, 1.2), "b": (2.0, 1.8), "c": (math.nan, 1.0)}))
    assert len(ax.collections) == 2

    p, q = np.full(20, 0.05), np.r_[np.full(10, 0.1), np.zeros(10)]
    ax = only_axes(plot.plot_acceptance_test(p, q, drafted=15, top=6))
    assert len(ax.patches) == 3 * 6 and ax.get_xticklabels()[5].get_text() == "15"


def test_figures_draw_on_a_given_axes(mpl):
    from matplotlib.figure import Figure

    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert plot.plot_verify_costs([1.0, 1.5], ax=right) is fig
    assert len(right.lines) == 3 and not left.lines
    fig.savefig(__import__("io").BytesIO(), format="png")  # renders without a display


def test_plots_take_one_result_a_list_or_a_dict(mpl, sampled_run):
    """What a notebook passes: a result, [results], {label: result}, and race reports the same ways."""
    from specdec.race import race

    target, draft = tiny_model(seed=0), tiny_model(seed=1)
    report = race(target, draft, [1, 2, 3], 12, K=3, temperature=1.0, seed=3, warmup=False, repeats=1)
    for results in (sampled_run, [sampled_run], {"a": sampled_run}, report, [report, sampled_run]):
        assert only_axes(plot.plot_acceptance_by_position(results)).patches
        assert only_axes(plot.plot_accepted_histogram(results)).patches
    assert len(only_axes(plot.plot_accepted_histogram([sampled_run, sampled_run])).patches) == 2 * (
        len(sampled_run.accepted_histogram)
    )
    for points in (report, [report], {"K=3": report}, (1.5, 1.2)):
        assert len(only_axes(plot.plot_predicted_vs_measured(points)).collections) == 1
    with pytest.raises(TypeError, match="a list or a dict"):
        plot.plot_accepted_histogram(42)


def test_an_empty_prompt_starts_from_the_models_own_end_token():
    from specdec import autoregressive_sample, load_model

    model = load_model("stdlib-2L")
    assert model.tokenizer.eot_token != 50256  # not GPT-2's
    from_eot = autoregressive_sample(model, [model.tokenizer.eot_token], 4).tokens
    assert autoregressive_sample(model, [], 4).tokens == from_eot == autoregressive_sample(model, "", 4).tokens


def test_batch_throughput_sorts_batch_sizes_given_as_json_keys():
    batches = {
        "4": {"throughput_auto": 40.0, "throughput_spec": 30.0},
        "1": {"throughput_auto": 10.0, "throughput_spec": 19.0},
    }
    sizes, auto, spec = plot.batch_throughput(batches)
    assert sizes.tolist() == [1, 4] and auto.tolist() == [10.0, 40.0] and spec.tolist() == [19.0, 30.0]
    pytest.importorskip("matplotlib")
    fig = plot.plot_batch_throughput({"124M": batches})
    assert len(fig.axes[0].lines) == 2
