"""Plots of speculative decoding: what was accepted, where, and what it buys.

Optional: the library itself needs only NumPy. These functions import
matplotlib when called, and say how to install it when it is missing:

    pip install -e '.[notebook]'      # matplotlib, Jupyter, the kernel

Every plot function returns a matplotlib Figure (built directly, not through
pyplot, so nothing is left open in a global registry): display it in a
notebook, or `fig.savefig("out.png")`. Each one draws on a new figure, or on
an existing Axes passed as `ax=`.

Each plot has a data function next to it that does all the arithmetic and
needs no matplotlib; the plot only draws what it returns.

    acceptance_by_position   P(accept draft i | drafts 1..i-1 accepted), i = 1..K
    accepted_histogram       rounds by how many of their drafts were accepted
    predicted_vs_measured    the cost model's speedup against the stopwatch's
    speedup_grid             speedup over alpha for each K from measured c and r(m)
                             (Leviathan et al., arXiv 2211.17192, Figure 3, for this machine)
    verify_costs             r(m): a pass over m new tokens vs a 1-token step
    tree_vs_chain            any numbers per drafting shape, side by side
    acceptance_test          p and q at one position, and the residual max(0, p - q)
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..costmodel import predicted_speedup
from ..result import KIND_COLOURS  # one colour per way a token was produced, as in the HTML trace
from ..result import acceptance_by_position as _acceptance_by_position

INSTALL_HINT = "pip install -e '.[notebook]'"


def _figure(ax, size=(6.4, 3.6)):
    """(figure, axes): the Axes given, or a fresh Figure with one Axes."""
    if ax is not None:
        return ax.figure, ax
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(f"specdec.bench.plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


# ---------------------------------------------------------------------------
# Acceptance, from the per-round record of a speculative run.
# ---------------------------------------------------------------------------


def _is_run(x) -> bool:
    """One run: a DecodeResult, a RaceReport, or (k_per_round, accepted_per_round) as two lists of ints."""
    if hasattr(x, "k_per_round") or hasattr(x, "explain"):
        return True
    return (
        isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(v, (list, tuple, range, np.ndarray)) for v in x)
    )


def _labelled(results) -> dict:
    """label -> run, from one run, a list of runs ("1", "2", ...) or a mapping label -> run.

    _labelled(result) == {"": result}; _labelled([a, b]) == {"1": a, "2": b}
    """
    if isinstance(results, Mapping):
        return dict(results)
    if _is_run(results):
        return {"": results}
    if isinstance(results, (list, tuple)):
        return {str(i): run for i, run in enumerate(results, start=1)}
    raise TypeError(
        f"expected a result (DecodeResult, RaceReport or (k_per_round, accepted_per_round)), a list "
        f"or a dict of them, got {type(results).__name__}"
    )


def _rounds(result) -> tuple[list[int], list[int]]:
    """(drafts proposed, drafts accepted) per round, from a DecodeResult, a RaceReport (its speculative
    run) or a pair of lists."""
    if hasattr(result, "explain"):  # a RaceReport
        if result.spec is None:
            raise ValueError("this RaceReport has no speculative run (decoders=('autoregressive',)): nothing drafted")
        result = result.spec.result
    if hasattr(result, "k_per_round"):
        return list(result.k_per_round), list(result.accepted_per_round)
    k, n = result
    return list(k), list(n)


def acceptance_by_position(result) -> tuple[np.ndarray, np.ndarray]:
    """Per draft position i = 1..K: (acceptance rate, rounds that judged position i); see
    result.acceptance_by_position. result: a DecodeResult, a RaceReport or (k_per_round, accepted_per_round)."""
    return _acceptance_by_position(*_rounds(result))


def plot_acceptance_by_position(results, ax=None):
    """Bars: acceptance rate at each draft position 1..K, one group per run.

    results: one run (a DecodeResult, a RaceReport or a (k_per_round,
    accepted_per_round) pair), a list of runs, or a mapping label -> run, to
    compare drafters or temperatures.
    A dashed line marks each run's overall alpha (accepted / judged): flat bars
    at that line would mean acceptance is the same at every position, as the
    cost model assumes.
    """
    runs = _labelled(results)
    fig, ax = _figure(ax)
    width = 0.8 / max(1, len(runs))
    for j, (label, run) in enumerate(runs.items()):
        rate, tested = acceptance_by_position(run)
        positions = np.arange(1, len(rate) + 1)
        bars = ax.bar(positions + (j - (len(runs) - 1) / 2) * width, np.nan_to_num(rate), width, label=label or None)
        judged = tested.sum()
        alpha = sum(min(n, k) for k, n in zip(*_rounds(run))) / judged if judged else math.nan
        if not math.isnan(alpha):
            ax.axhline(alpha, color=bars.patches[0].get_facecolor(), linestyle="--", linewidth=1)
    ax.set(xlabel="draft position i", ylabel="P(accept i | 1..i-1 accepted)", ylim=(0, 1.05))
    ax.set_title("acceptance per draft position (dashed: overall alpha)")
    if any(runs):
        ax.legend()
    return fig


def accepted_histogram(result) -> np.ndarray:
    """[K_max + 1]: rounds that accepted n = 0..K_max of their drafts; as DecodeResult.accepted_histogram, a
    round that drafted nothing accepted 0, so the counts sum to the rounds."""
    ks, ns = _rounds(result)
    counts = np.zeros(max([*ks, *ns], default=0) + 1, dtype=np.int64)
    for n in ns:
        counts[n] += 1
    return counts


def plot_accepted_histogram(results, alpha: float | None = None, ax=None):
    """Bars: how many rounds accepted 0, 1, ..., K drafts; one group per run for a list or dict of runs.

    With alpha given (one run, every round drafting the same K), dots show what the
    i.i.d. model predicts: P(n) = alpha^n (1 - alpha) for n < K, alpha^K for n = K.
    """
    runs = _labelled(results)
    hists = {label: accepted_histogram(run) for label, run in runs.items()}
    fig, ax = _figure(ax)
    width = 0.8 / max(1, len(runs))
    for j, (label, counts) in enumerate(hists.items()):
        n = np.arange(len(counts))
        colour = KIND_COLOURS["draft"] if len(runs) == 1 else None
        ax.bar(n + (j - (len(runs) - 1) / 2) * width, counts, width, color=colour, label=label or "measured")
    total = sum(int(c.sum()) for c in hists.values())
    if alpha is not None and len(runs) == 1 and total:
        counts = next(iter(hists.values()))
        k = len(counts) - 1
        expected = [alpha**i * (1 - alpha) for i in range(k)] + [alpha**k]
        ax.plot(np.arange(k + 1), total * np.asarray(expected), "ko", label=f"i.i.d. model, alpha={alpha:.2f}")
    if (alpha is not None and len(runs) == 1) or len(runs) > 1:
        ax.legend()
    ax.set(xlabel="drafts accepted in the round", ylabel="rounds", xticks=np.arange(max(map(len, hists.values()))))
    ax.set_title(f"accepted drafts per round ({total} rounds)")
    return fig


# ---------------------------------------------------------------------------
# Speed: the cost model against the stopwatch.
# ---------------------------------------------------------------------------


def predicted_vs_measured(points) -> list[tuple[str, float, float]]:
    """[(label, predicted, measured)] from one RaceReport, a list of them, or a mapping label -> RaceReport
    (or an explain() dict, or a (predicted, measured) pair); runs without a prediction are left out."""
    if isinstance(points, (tuple, list)) and len(points) == 2 and all(isinstance(x, (int, float)) for x in points):
        points = {"": points}  # one (predicted, measured) pair
    elif not isinstance(points, Mapping):
        points = {"": points} if hasattr(points, "explain") else {str(i): p for i, p in enumerate(points, start=1)}
    rows = []
    for label, point in points.items():
        if hasattr(point, "explain"):
            point = point.explain()
        if isinstance(point, Mapping):
            predicted = point.get("predicted_speedup", point.get("tree_predicted_speedup", math.nan))
            point = (predicted, point.get("measured_speedup", math.nan))
        predicted, measured = (float(x) for x in point)
        if math.isfinite(predicted) and math.isfinite(measured):
            rows.append((str(label), predicted, measured))
    return rows


def plot_predicted_vs_measured(points, ax=None):
    """Scatter of the cost model's predicted speedup (x) against the measured one (y).

    points: one RaceReport, a list of them, or a mapping label -> RaceReport, explain() dict or
    (predicted, measured).
    On the diagonal the model explains the run; far below it, something the
    model leaves out (sampler overhead, cache growth, noise) costs time.
    """
    rows = predicted_vs_measured(points)
    fig, ax = _figure(ax, size=(4.8, 4.4))
    top = max([1.5] + [max(p, m) * 1.1 for _, p, m in rows])
    ax.plot([0, top], [0, top], color="grey", linestyle="--", linewidth=1)
    for label, predicted, measured in rows:
        ax.scatter([predicted], [measured])
        ax.annotate(label, (predicted, measured), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axhline(1, color="grey", linewidth=0.5)
    ax.set(xlabel="predicted speedup", ylabel="measured speedup", xlim=(0, top), ylim=(0, top))
    ax.set_title("cost model vs stopwatch")
    return fig


def speedup_grid(c: float, r=None, ks: Sequence[int] = range(1, 9), alphas=None) -> tuple[np.ndarray, np.ndarray]:
    """(alphas [n], speedup [len(ks), n]): predicted speedup for each K over alpha in [0, 1).

    c: a draft step's cost in target steps; r: the measured r(m) list (None: the
    paper's r = 1). Leviathan et al.'s section 3 formula, via costmodel.predicted_speedup.
    """
    alphas = np.linspace(0, 0.99, 100) if alphas is None else np.asarray(alphas, dtype=np.float64)
    grid = np.array([[predicted_speedup(float(a), int(k), c, r) for a in alphas] for k in ks])
    return alphas, grid


def plot_speedup_grid(c: float, r=None, ks: Sequence[int] = range(1, 9), measured=None, ax=None):
    """Predicted speedup as a function of alpha, one line per K, for this machine's c and r(m).

    Leviathan et al. (arXiv 2211.17192) draw this in Figure 3 for the ideal
    r = 1 of a GPU; on a CPU, where a pass over m tokens costs r(m) > 1 steps,
    the lines drop and the best K shrinks. measured: optional (alpha, speedup)
    of a real run, drawn as a star.
    """
    alphas, grid = speedup_grid(c, r, ks)
    fig, ax = _figure(ax)
    for k, line in zip(ks, grid):
        ax.plot(alphas, line, label=f"K={k}")
    ax.plot(alphas, grid.max(axis=0), color="black", linewidth=2, alpha=0.3, label="best K")
    if measured is not None:
        ax.plot([measured[0]], [measured[1]], "k*", markersize=12, label="measured run")
    ax.axhline(1, color="grey", linewidth=0.5)
    ax.set(xlabel="alpha (accepted / judged drafts)", ylabel="predicted speedup", xlim=(0, 1))
    ax.set_title(f"speedup vs alpha, c = {c:.3g}, " + ("r = 1" if r is None else "measured r(m)"))
    ax.legend(fontsize=7, ncol=2)
    return fig


def verify_costs(r: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(m, r(m)) for m = 1..len(r), checked: r(1) = 1 by definition."""
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 1 or not len(r) or not np.isclose(r[0], 1.0):
        raise ValueError("r must list r(1), r(2), ... with r(1) = 1 (costs relative to a 1-token step)")
    return np.arange(1, len(r) + 1), r


def plot_verify_costs(r: Sequence[float] | Mapping[str, Sequence[float]], ax=None):
    """r(m): the cost of one target pass over m new tokens in 1-token steps, m = 1..len(r).

    r: one measured curve, or a mapping label -> curve (e.g. one per model size).
    Two reference lines frame it: r = 1 (memory-bound, a GPU's idle compute:
    verifying K+1 tokens costs one step) and r = m (compute-bound: no gain from batching).
    """
    curves = r if isinstance(r, Mapping) else {"measured": r}
    fig, ax = _figure(ax)
    m_max = 1
    for label, curve in curves.items():
        m, values = verify_costs(curve)
        ax.plot(m, values, "o-", label=label)
        m_max = max(m_max, len(m))
    m = np.arange(1, m_max + 1)
    ax.plot(m, np.ones(m_max), "--", color="grey", label="r = 1 (GPU-like)")
    ax.plot(m, m, ":", color="grey", label="r = m (no batching gain)")
    ax.set(xlabel="tokens in one pass, m", ylabel="r(m) = time(m) / time(1)", xticks=m)
    ax.set_title("cost of verifying m tokens at once")
    ax.legend(fontsize=8)
    return fig


def tree_vs_chain(numbers: Mapping[str, Mapping[str, float]]) -> tuple[list[str], list[str], np.ndarray]:
    """(shapes, metrics, values [n_shapes, n_metrics]) from {shape: {metric: value}}; missing values are nan."""
    shapes = list(numbers)
    metrics = list(dict.fromkeys(m for row in numbers.values() for m in row))
    if not shapes or not metrics:
        raise ValueError("tree_vs_chain needs {shape label: {metric: value}}, e.g. {'chain K=4': {'tau': 2.1}}")
    values = np.array([[float(numbers[s].get(m, math.nan)) for m in metrics] for s in shapes])
    return shapes, metrics, values


def plot_tree_vs_chain(numbers: Mapping[str, Mapping[str, float]], ax=None):
    """Grouped bars comparing drafting shapes on any metrics.

    numbers: {shape: {metric: value}}, e.g.
        {"chain K=4": {"tau": 2.3, "speedup": 1.4}, "tree, 16 nodes": {"tau": 3.1, "speedup": 1.6}}
    One group per metric, one bar per shape, each bar labelled with its value.
    """
    shapes, metrics, values = tree_vs_chain(numbers)
    fig, ax = _figure(ax)
    x = np.arange(len(metrics))
    width = 0.8 / len(shapes)
    for j, shape in enumerate(shapes):
        bars = ax.bar(x + (j - (len(shapes) - 1) / 2) * width, np.nan_to_num(values[j]), width, label=shape)
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values[j]], fontsize=7)
    ax.set_xticks(x, metrics)
    ax.set_title("drafting shapes compared")
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------
# One acceptance test, drawn.
# ---------------------------------------------------------------------------


def acceptance_test(p: np.ndarray, q: np.ndarray, drafted: int, top: int = 12) -> dict:
    """Everything to draw one position's test: the `top` tokens most likely under
    p or q (the drafted token always among them), p, q and the normalised
    residual max(0, p - q) on them, and the acceptance probability min(1, p(x)/q(x)).

    p: [n_vocab] target distribution; q: [n_vocab] draft distribution; drafted: the draft token x.
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"p and q must be two [n_vocab] distributions, got shapes {p.shape} and {q.shape}")
    residual = np.maximum(p - q, 0)
    mass = residual.sum()
    residual = residual / mass if mass > 0 else residual
    order = np.argsort(-np.maximum(p, q), kind="stable")[:top]
    tokens = list(order) if drafted in order else [*order[: top - 1], drafted]
    return {
        "tokens": [int(t) for t in tokens],
        "p": p[tokens],
        "q": q[tokens],
        "residual": residual[tokens],
        "accept_probability": min(1.0, p[drafted] / q[drafted]) if q[drafted] > 0 else math.nan,
        "overlap": float(np.minimum(p, q).sum()),  # sum_x min(p, q): this position's expected acceptance (beta)
    }


def plot_acceptance_test(p, q, drafted: int, tokenizer=None, top: int = 12, ax=None):
    """Bars of p (target) and q (draft) over the likeliest tokens at one position,
    the drafted token marked, and the residual norm(max(0, p - q)) that a
    rejection draws from (Leviathan et al., Algorithm 1)."""
    d = acceptance_test(p, q, drafted, top)
    fig, ax = _figure(ax, size=(7.5, 3.6))
    x = np.arange(len(d["tokens"]))
    ax.bar(x - 0.27, d["p"], 0.27, label="p (target)", color=KIND_COLOURS["target"])
    ax.bar(x, d["q"], 0.27, label="q (draft)", color=KIND_COLOURS["draft"])
    ax.bar(x + 0.27, d["residual"], 0.27, label="norm(max(0, p - q))", color="grey")
    names = [repr(tokenizer.decode([t])) if tokenizer is not None else str(t) for t in d["tokens"]]
    ax.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
    i = d["tokens"].index(drafted)
    ax.get_xticklabels()[i].set_fontweight("bold")
    ax.set_ylabel("probability")
    ax.set_title(
        f"drafted {names[i]}: accepted with probability min(1, p/q) = {d['accept_probability']:.2f}; "
        f"overlap sum min(p, q) = {d['overlap']:.2f}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------
# Batches (python -m specdec.bench --only batch --json PATH).
# ---------------------------------------------------------------------------


def batch_throughput(batches: Mapping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch sizes, autoregressive tokens/s, speculative tokens/s), sorted by batch size, from one model's
    "batches" of the batch bench's JSON: {B: {"throughput_auto": .., "throughput_spec": ..}}."""
    sizes = sorted(batches, key=int)
    auto = [batches[b]["throughput_auto"] for b in sizes]
    spec = [batches[b]["throughput_spec"] for b in sizes]
    return np.array([int(b) for b in sizes]), np.array(auto, float), np.array(spec, float)


def plot_batch_throughput(models: Mapping, ax=None):
    """Tokens/s over the batch against batch size, autoregressive (dashed) and speculative (solid), per model.

    models: {label: that model's "batches"} from the JSON. Where the solid line drops
    below the dashed one, speculation has stopped paying.
    """
    fig, ax = _figure(ax)
    for i, (label, batches) in enumerate(models.items()):
        sizes, auto, spec = batch_throughput(batches)
        colour = f"C{i}"
        ax.plot(sizes, auto, "--o", color=colour, label=f"{label}: autoregressive")
        ax.plot(sizes, spec, "-s", color=colour, label=f"{label}: speculative")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("tokens / s over the batch")
    ax.legend(fontsize="small")
    return fig
