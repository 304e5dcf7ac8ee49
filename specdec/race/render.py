"""How a race shows itself: the text summary main.py prints, the same as plain JSON values, and HTML in a notebook.

Everything here reads a RaceReport (race.py: the runs, their statistics and what the cost model
predicts from them) and computes nothing the report does not: a figure printed is a figure the
report holds.

    print(report)            # text(report)
    report.to_dict()         # to_dict(report), what main.py --json prints
    report                   # in a notebook: to_html(report)
"""

from __future__ import annotations

import html
import math

import numpy as np

from ..result import fmt, sparkline, token_pieces, trace_html


def plural(n: int, word: str) -> str:
    """n and the noun, in the plural unless n is 1; a noun ending in s takes es.

    >>> plural(1, "token"), plural(3, "round"), plural(2, "pass")
    ('1 token', '3 rounds', '2 passes')
    """
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


def to_dict(report) -> dict:
    """Everything as plain JSON values (nan -> None), as main.py --json prints it."""
    out: dict = {"settings": dict(report.settings)}
    for name, run, runs in report.decoders_run():
        r = run.result
        out[name] = {
            "seconds": run.seconds,
            "seconds_all_repeats": [x.seconds for x in runs],
            "tokens_per_second": run.tokens_per_second,
            "tokens": r.tokens,
            "target_calls": r.target_calls,
            "draft_calls": r.draft_calls,
            "tau": r.tau,
        }
        if report.tokenizer is not None:
            out[name]["text"] = report.tokenizer.decode(r.tokens)
        if name == "speculative":
            out[name].update(
                {
                    "rounds": r.rounds,
                    "prefill_calls": r.prefill_calls,
                    "drafted": r.drafted,
                    "judged": sum(r.judged),
                    "accepted": r.accepted,
                    "alpha": r.alpha,
                    "acceptance_by_position": r.acceptance_by_position,
                    "kinds": r.kinds,
                    "accepted_histogram": r.accepted_histogram,
                    "mean_k": r.mean_k,
                    "draft_seconds": run.draft_seconds,
                    "verify_seconds": run.verify_seconds,
                    "sampler_seconds": run.sampler_seconds,
                }
            )
            out[name].update(  # the same rounds as the serving engines count them (engine_rows)
                draft_acceptance_rate=r.draft_acceptance_rate,
                mean_acceptance_length=r.mean_acceptance_length,
                acceptance_by_position_per_round=r.acceptance_by_position_per_round,
                drafted_per_second=run.drafted_per_second,
                accepted_per_second=run.accepted_per_second,
            )
    c = report.costs
    out["costs"] = (
        None
        if c is None
        else {
            "target_step_seconds": c.target_step,
            "draft_step_seconds": c.draft_step,
            "c": c.c,
            "r": c.r,
            "note": c.note,
        }
    )
    if report.spec:
        out["summary"] = {
            "speedup": report.speedup,
            "speedup_is": report.speedup_label,
            "speedups": report.speedups,
            "spread": list(report.spread),
            "margin": report.margin,
            "verdict": report.verdict,
            "texts_identical": report.texts_identical,
            **report.explain(),
        }
    return jsonable(out)


def text(report) -> str:
    """The summary main.py prints: each decoder's timing, then the speedup, verdict and cost model's figures."""
    return "\n".join(timing_lines(report) + ["", "── summary " + "─" * 62] + summary_lines(report))


def one_line(report) -> str:
    """One line: RaceReport(speedup 1.42x, alpha 0.81, tau 3.10, K=4, 40 tokens)."""
    parts = [f"speedup {report.speedup:.2f}x"] if report.ar and report.spec else []
    run = report.spec or report.ar
    if report.spec:
        parts += [f"alpha {fmt(run.result.alpha)}", f"tau {fmt(run.result.tau)}"]
    parts += [f"K={report.settings.get('K')}"] if report.spec else []
    parts += [f"{len(run.result.tokens)} tokens"] if run else []
    return "RaceReport(" + ", ".join(parts) + ")"


def to_html(report) -> str:
    """In a notebook: the summary, then the speculative run's coloured trace."""
    out = f'<pre style="margin:0">{html.escape(text(report))}</pre>'
    if report.spec and report.tokenizer is not None:
        r = report.spec.result
        out += trace_html(token_pieces(report.tokenizer, r.tokens), r.kinds)
    return out


def timing_lines(report) -> list[str]:
    lines = []
    for name, run, runs in report.decoders_run():
        r = run.result
        n = len(runs)
        median = f", the median of {n} repeats" if n > 1 else ""
        line = (
            f"[{name}] {len(r.tokens)} tokens in {run.seconds:.2f} s ({run.tokens_per_second:.1f} tokens/s{median}), "
        )
        line += f"{r.target_calls} target passes"
        if name == "speculative":
            line += f", {r.draft_calls} draft passes"
        lines.append(line)
        if name == "speculative":
            share = {k: getattr(run, f"{k}_seconds") for k in ("draft", "verify", "sampler")}
            labels = {"draft": "drafting", "verify": "verifying", "sampler": "sampler"}
            parts = [f"{labels[k]} {s:.2f} s ({s / run.seconds:.0%})" for k, s in share.items()]
            lines.append(f"[{name}] time: " + ", ".join(parts))
    return lines


def summary_lines(report) -> list[str]:
    c, spec = report.costs, report.spec
    if spec is None:
        ar = report.ar
        per_token = f"{ar.seconds / len(ar.result.tokens) * 1e3:.1f} ms" if ar and ar.result.tokens else "-"
        return [
            f"autoregressive: {per_token} per new token, the pass over the prompt included (no forward-pass "
            "costs measured: they price speculative rounds, and none ran)"
        ]
    costs = f"{c.c:.3f}  ({c.draft_step * 1e3:.1f} ms vs {c.target_step * 1e3:.1f} ms)"
    r, summary = spec.result, report.explain()
    tree = "tree_predicted_speedup" in summary  # a tree: one pass checks several candidates per depth
    prompt_pass = f"; +{plural(r.prefill_calls, 'pass')} over the prompt" if r.prefill_calls else ""
    widest = max(r.k_per_round, default=0)  # positions no round drafted are left out (K may be up to 32)
    histogram = r.accepted_histogram[: max(r.accepted_per_round, default=0) + 1]  # counts up to the most accepted
    # The headline prices the rounds this run had (a round may draft fewer than K, or nothing: an n-gram miss, a
    # draft confidence bar), not eq. 1's every-round-drafts-k, which overstates such runs.
    predicted = summary.get("tree_predicted_speedup", summary.get("predicted_speedup_from_rounds", math.nan))
    rows = speedup_rows(report, predicted) if report.ar else []
    rows += [
        (
            "alpha (accepted / judged drafts)",
            f"{fmt(r.alpha)}  ({r.accepted} accepted of {sum(r.judged)} judged; {r.drafted} drafted)",
        ),
        (
            "tau (tokens per round = per target pass)",
            f"{fmt(r.tau)}  ({plural(len(r.tokens), 'token')} in {plural(r.rounds, 'round')}{prompt_pass})",
        ),
        (
            f"acceptance at {'depth' if tree else 'draft position'} 1..K",
            "  ".join(fmt(a) for a in r.acceptance_by_position[:widest]) or "-",
        ),
        ("rounds by drafts accepted (0, 1, ...)", f"{histogram}  {sparkline(histogram)}"),
        ("draft / target passes", f"{r.draft_calls} / {r.target_calls}"),
        ("cost of a draft step, c = draft / target", costs),
    ]
    rows += engine_rows(spec)
    if "tree_predicted_speedup" in summary:
        n = summary["mean_nodes"]
        rows += [
            ("mean tree nodes per round", f"{n:.2f}  ({summary['draft_passes_per_round']:.2f} draft passes)"),
            (f"target pass over {n + 1:.1f} tokens vs 1 token", fmtx(summary["tree_verify_cost_ratio"])),
            ("predicted speedup tau / (c * passes + r(nodes + 1))", fmtx(summary["tree_predicted_speedup"])),
        ]
    bar = report.settings.get("draft_confidence_bar")
    if bar is not None:
        how = "set by the costs, c + r(2) - 1" if report.settings.get("draft_confidence") == "auto" else "given"
        rows.append(("draft confidence bar (chains cut below it)", f"{bar:g}  ({how})"))
    if report.rounds_only and "predicted_speedup_from_rounds" in summary:  # eq. 1 left out (RaceReport.rounds_only)
        drafting = sum(drafts > 0 for drafts in r.k_per_round)
        rows.append(
            (
                "k, mean drafts per round that drafted",
                f"{fmt(summary['mean_k'])}  ({drafting} of {plural(r.rounds, 'round')} drafted)",
            )
        )
        if "verify_cost_ratio" in summary:
            rows.append(
                (
                    f"target pass over k+1={round(summary['mean_k']) + 1} tokens vs 1 token",
                    fmtx(summary["verify_cost_ratio"]),
                )
            )
        rows += [
            ("predicted speedup from this run's own rounds", fmtx(summary["predicted_speedup_from_rounds"])),
            (
                "  ...the same rounds if verifying cost one step",
                fmtx(summary["predicted_speedup_from_rounds_if_r_were_1"]),
            ),
        ]
    elif "predicted_speedup" in summary:
        k = round(summary["mean_k"])
        best, drafting = summary["best_k"], sum(drafts > 0 for drafts in r.k_per_round)
        rows += [
            (
                "k, mean drafts per round that drafted",
                f"{summary['mean_k']:.2f}  ({drafting} of {plural(r.rounds, 'round')} drafted)",
            ),
            (f"target pass over k+1={k + 1} tokens vs 1 token", fmtx(summary["verify_cost_ratio"])),
            (f"tau expected from alpha, (1-a^{k + 1})/(1-a)", fmt(summary["tau_expected"])),
            ("predicted speedup from alpha, k, c and r", fmtx(summary["predicted_speedup"])),
            ("  ...from this run's own rounds", fmtx(summary["predicted_speedup_from_rounds"])),
            ("  ...if verifying cost one step (GPU-like)", fmtx(summary["predicted_speedup_if_r_were_1"])),
            (
                "best K for these costs and alpha",
                "none: plain decoding wins" if best == 0 else f"{best} (predicted {fmtx(summary['best_k_speedup'])})",
            ),
        ]
        if "auto_k" in summary:  # the same formula (best_k) on the policy's own alpha, which lags this run's
            policy, auto_k = spec.k_policy, summary["auto_k"]
            why = (
                "the best K above"
                if auto_k == best
                else f"starts at {fmt(policy.prior_alpha)} and forgets {1 - policy.decay:.0%} a round, so on a short "
                "run it lags the alpha above"
            )
            rows.append(("--K auto: its running alpha -> its K", f"{fmt(summary['auto_alpha'])} -> {auto_k}  ({why})"))
    lines_after = [f"NOTE: the costs c and r(m): {report.costs.note}"] if report.costs.note else []
    problem = report.curve()[1]
    if problem:
        lines_after.append(
            f"NOTE: the recorded r(m) is implausible ({problem}), so the predictions above use it "
            "capped at m, raised to at least 1 and made non-decreasing"
        )
    # The prediction the headline prints (from this run's rounds, or the tree's), whatever eq. 1 was left out for;
    # a measured figure above what the passes allow is said in the verdict itself.
    if report.ar and report.verdict != "noise" and _far_apart(report.speedup, predicted):
        lines_after.append(
            "NOTE: the measured and predicted speedups differ by more than 1.5x, so the timings are noisy "
            "(a busy machine?); more repeats (--repeats 5) take medians"
        )
    if report.settings.get("temperature") == 0 and report.ar:
        i = report.first_difference()
        same = (
            "yes"
            if i is None
            else (
                f"NO: they differ from new token {i}. A float32 near-tie between the two best tokens can do "
                f"this (the two decoders round differently; --float64 removes it); a difference at a clear winner "
                f"is a bug"
            )
        )
        rows.append(("identical text at temperature 0", same))
    width = max(len(key) for key, _ in rows)
    return [f"{key:<{width}}  {value}" for key, value in rows] + lines_after


def engine_rows(run) -> list[tuple[str, str]]:
    """The speculative run's rounds as the serving engines count them (docs/engines.md): vLLM's SpecDecoding
    log line and llama.cpp's llama-server divide by every draft proposed and by the rounds that drafted."""
    r = run.result
    drafting = sum(k > 0 for k in r.k_per_round)
    rate = f"{fmt(r.draft_acceptance_rate)}  ({r.accepted} of {r.drafted}, unjudged drafts counted)"
    length = f"{fmt(r.mean_acceptance_length)}  ({drafting} of {plural(r.rounds, 'round')} drafted)"
    widest = max(r.k_per_round, default=0)  # positions no round drafted are left out (K may be up to 32)
    by_position = "  ".join(fmt(a) for a in r.acceptance_by_position_per_round[:widest]) or "-"
    throughput = f"{run.drafted_per_second:.1f} / {run.accepted_per_second:.1f}"
    return [
        ("accepted / drafted (vLLM, llama.cpp: draft acceptance)", rate),
        ("1 + accepted / rounds that drafted (mean acceptance length)", length),
        ("first i drafts accepted / rounds, i = 1..K (vLLM's per position)", by_position),
        ("drafted / accepted tokens per second", throughput),
    ]


def speedup_rows(report, predicted: float) -> list[tuple[str, str]]:
    """The measured speedup (the ratio of the two medians printed above it) with the repeats' spread, the verdict
    in words, and the cost model's prediction."""
    ar, spec = report.ar, report.spec
    if report.same_lengths:  # the ratio of the two median times printed above
        of = f"{ar.seconds:.2f} s / {spec.seconds:.2f} s"
    else:  # the times are of different work, and only the rates compare
        of = f"{spec.tokens_per_second:.1f} / {ar.tokens_per_second:.1f} tokens/s"
    low, high = report.spread
    n = len(report.speedups)
    spread = f"each repeat's own ratio {fmtx(low)} .. {fmtx(high)}" if n > 1 else "1 repeat: no spread measured"
    medians = "the medians above" if n > 1 else "the runs above"
    if not report.same_lengths:
        spread += "; rates, as the two decoders made different numbers of tokens"
    return [
        (f"speedup ({report.speedup_label})", f"{fmtx(report.speedup)}  ({of}, {medians}; {spread})"),
        (f"verdict (margin ±{report.margin:.0%}: 20% or the spread)", f"{report.verdict}  ({verdict_why(report)})"),
        ("predicted by the cost model (from the figures below)", fmtx(predicted)),
    ]


def verdict_why(report) -> str:
    """What the verdict was decided against: the margin around 1x, or what the passes allow."""
    if report.verdict == "noise":
        r = report.spec.result
        return (
            f"{fmtx(report.speedup)} is more than these passes allow, at most {fmtx(report.passes_bound)}: "
            f"{plural(len(r.tokens), 'token')} for {plural(r.rounds, 'verification pass')} and "
            f"{plural(r.draft_steps, 'draft step')} at c = {report.costs.c:.3f}, against a pass a token; the timings "
            "are noisy"
        )
    limit = 1 + report.margin if report.speedup >= 1 else 1 / (1 + report.margin)
    side = {"faster": "above", "slower": "below"}.get(report.verdict, "inside")
    bound = f"{fmtx(limit)}" if side != "inside" else f"{fmtx(1 / (1 + report.margin))} .. {fmtx(1 + report.margin)}"
    return f"{side} {bound}"


def fmtx(x: float) -> str:
    """A speedup: '1.42x', or '-' when there is none to show."""
    return fmt(x) + ("x" if fmt(x) != "-" else "")


def _far_apart(measured: float, predicted: float, factor: float = 1.5) -> bool:
    return measured > 0 and predicted > 0 and not 1 / factor <= measured / predicted <= factor


def jsonable(value):
    """Results as plain JSON values: NumPy scalars to Python ones, nan and inf
    (e.g. an acceptance rate with nothing drafted) to null."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
