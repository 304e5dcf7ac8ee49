"""The race: time autoregressive and speculative decoding on the same request, and
explain the result with the cost model of Leviathan et al. (arXiv 2211.17192, section 3).

The samplers never time themselves. For the duration of a run this module wraps
the target's forward pass and the drafter's `propose` with stopwatches, so a
speculative run's wall time splits into drafting, verifying and the sampler's
own work, without touching the sampler code. The costs c and r(m) come from
timing.measure_costs, the same stopwatch the benchmark uses; they price speculative
rounds, so a race of the autoregressive decoder alone measures none.

    report = race(target, draft, ids, n_tokens=64, K=4, repeats=3)
    print(report)            # the text summary main.py prints
    report.to_dict()         # the same as plain JSON values (main.py --json)
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .autoregressive import autoregressive_sample, check_request, check_seed, whole_number
from .costmodel import (
    K_LIMIT,
    CostModelK,
    TreePolicy,
    best_k,
    expected_tokens_per_round,
    make_k_policy,
    make_tree_policy,
    parse_k,
    predicted_speedup,
    speedup_from_rounds,
)
from .drafters import CrossVocabDrafter, make_drafter
from .model.base import CausalLM
from .result import DecodeResult, TokenCallback, fmt, sparkline, token_pieces, trace_html
from .sampling import SamplingParams
from .speculative import check_verification, speculative_sample
from .timing import Costs, implausible, measure_costs, plausible
from .words import plural

DECODERS = ("autoregressive", "speculative")
# The smallest margin a speedup must clear to be called faster or slower: identical runs on a busy
# 2-core machine differed by this much and more (0.72x, 1.66x, 1.24x for one command).
NOISE_FLOOR = 0.20


class _Stopwatch:
    """Wraps a bound method on one object; adds up the seconds spent inside it."""

    def __init__(self, owner, name: str, skip_while=None):
        self.owner, self.name = owner, name
        self.inner = getattr(owner, name)
        self.skip_while = skip_while  # another stopwatch: calls nested in it are not counted
        self.seconds, self.calls, self.running = 0.0, 0, False

    def __call__(self, *args, **kwargs):
        if self.skip_while is not None and self.skip_while.running:
            return self.inner(*args, **kwargs)
        start = time.perf_counter()
        self.running = True
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.running = False
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def __enter__(self):
        setattr(self.owner, self.name, self)  # an instance attribute shadows the method
        return self

    def __exit__(self, *exc):
        delattr(self.owner, self.name)
        return False


class RaceInterrupted(KeyboardInterrupt):
    """Ctrl-C during race(): .report holds what was measured so far (None if the costs were not yet
    measured), so a caller can still show it. A KeyboardInterrupt, so code that stops on Ctrl-C still does."""

    def __init__(self, report: RaceReport | None, during: str):
        super().__init__(f"interrupted while {during}")
        self.report, self.during = report, during


@dataclass
class Run:
    """One timed run of one sampler."""

    result: DecodeResult
    seconds: float  # wall time of the whole sampler call
    draft_seconds: float = 0.0  # inside the drafter's propose()
    verify_seconds: float = 0.0  # inside full target forward passes (prefill included)
    k_policy: object = field(default=None, repr=False)  # the speculative run's K policy, as the run left it

    @property
    def tokens_per_second(self) -> float:
        return len(self.result.tokens) / self.seconds if self.seconds else math.nan

    @property
    def sampler_seconds(self) -> float:
        """Everything but drafting and verifying: the sampler's own bookkeeping."""
        return self.seconds - self.draft_seconds - self.verify_seconds


@dataclass
class RaceReport:
    """What race() measured: every run of both decoders, the costs, and the settings.

    print(report) gives the text summary; report.to_dict() the same as plain JSON values.
    """

    settings: dict
    costs: Costs | None  # None when nothing speculative ran (the costs price speculative rounds)
    autoregressive: list[Run] = field(default_factory=list)  # one per repeat
    speculative: list[Run] = field(default_factory=list)
    tokenizer: object = field(default=None, repr=False)  # decodes the texts in to_dict(), when known

    @staticmethod
    def _median_run(runs: list[Run]) -> Run | None:
        return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2] if runs else None

    @property
    def ar(self) -> Run | None:
        return self._median_run(self.autoregressive)

    @property
    def spec(self) -> Run | None:
        return self._median_run(self.speculative)

    @property
    def speedups(self) -> list[float]:
        """One speedup per repeat: speculative tokens per second / autoregressive tokens per second of
        the two runs of that repeat, which ran back to back (> 1: speculative is faster). With the same
        tokens (greedy, or a shared seed) this is the ratio of the times; where a chat reply ends early,
        or sampling gives the two decoders different lengths, the rates keep it fair."""
        return [s.tokens_per_second / a.tokens_per_second for a, s in zip(self.autoregressive, self.speculative)]

    @property
    def same_lengths(self) -> bool:
        """Whether every repeat's two runs made the same number of tokens: then the speedup is also the
        ratio of the times; otherwise (a chat reply ending early, sampling) only of the rates."""
        return all(len(a.result.tokens) == len(s.result.tokens) for a, s in zip(self.autoregressive, self.speculative))

    @property
    def speedup_label(self) -> str:
        """What the speedup is a ratio of, in words."""
        if self.same_lengths:
            return "autoregressive time / speculative time"
        return "speculative tokens/s / autoregressive tokens/s"

    @property
    def speedup(self) -> float:
        """The median of the per-repeat speedups (nan unless both decoders ran)."""
        return float(np.median(self.speedups)) if self.speedups else math.nan

    @property
    def spread(self) -> tuple[float, float]:
        """(lowest, highest) per-repeat speedup: how far identical repeats disagreed."""
        return (min(self.speedups), max(self.speedups)) if self.speedups else (math.nan, math.nan)

    @property
    def margin(self) -> float:
        """How far from 1x a speedup must be to be called one: the measured spread relative to the
        median, and never less than NOISE_FLOOR (a 2-core machine shared with other work varies by that
        much between identical runs)."""
        low, high = self.spread
        return max(NOISE_FLOOR, (high - low) / self.speedup) if self.speedups else math.nan

    @property
    def verdict(self) -> str:
        """"faster", "slower" or "within noise": the median speedup against 1x, give or take the margin."""
        if not self.speedups:
            return "-"
        if self.speedup > 1 + self.margin:
            return "faster"
        if self.speedup < 1 / (1 + self.margin):
            return "slower"
        return "within noise"

    def _speedup_rows(self, predicted: float) -> list[tuple[str, str]]:
        """The measured speedup with its spread, the verdict in words, and the cost model's prediction."""
        low, high = self.spread
        n = len(self.speedups)
        spread = (f"the median of {n} repeats' own ratios, spread {fmtx(low)} .. {fmtx(high)}" if n > 1
                  else "1 repeat: no spread measured")  # fmt: skip
        if not self.same_lengths:  # then the times are of different work, and only the rates compare
            spread += "; rates, as the two decoders made different numbers of tokens"
        limit = 1 + self.margin if self.speedup >= 1 else 1 / (1 + self.margin)
        side = {"faster": "above", "slower": "below"}.get(self.verdict, "inside")
        bound = f"{fmtx(limit)}" if side != "inside" else f"{fmtx(1 / (1 + self.margin))} .. {fmtx(1 + self.margin)}"
        return [
            (f"speedup ({self.speedup_label})", f"{fmtx(self.speedup)}  ({spread})"),
            (f"verdict (margin ±{self.margin:.0%}: 20% or the spread)", f"{self.verdict}  ({side} {bound})"),
            ("predicted by the cost model (from the figures below)", fmtx(predicted)),
        ]

    @property
    def texts_identical(self) -> bool | None:
        return self.ar.result.tokens == self.spec.result.tokens if self.ar and self.spec else None

    def first_difference(self) -> int | None:
        """The index of the first new token where the two decoders differ (None if they agree)."""
        if not (self.ar and self.spec) or self.texts_identical:
            return None
        a, b = self.ar.result.tokens, self.spec.result.tokens
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def curve(self) -> tuple[list[float], str | None]:
        """The r(m) the predictions use, and why it differs from the recorded one (None when it does not).

        measure_costs never hands on an implausible curve, but a record can hold one (built by hand, or
        read back from an older run): r(2) below 1, say, would price a 2-token pass under a 1-token step
        and predict a best K no machine can reach. Such a curve is used repaired (timing.plausible).
        """
        problem = implausible(self.costs.r)
        return (plausible(self.costs.r), problem) if problem else (list(self.costs.r), None)

    def explain(self) -> dict:
        """The measured speedup next to what the cost model predicts from measured parts."""
        spec = self.spec
        if spec is None:
            return {}
        res, c, r = spec.result, self.costs.c, self.curve()[0]
        alpha, k_mean = res.alpha, res.mean_k
        out = {
            "alpha": alpha,
            "tau": res.tau,
            "c": c,
            "r": r,
            "mean_k": k_mean,
            "measured_speedup": self.speedup,
            "depth_acceptance": res.acceptance_by_position,
        }
        if self.settings.get("tree") is not None and res.rounds:
            # A tree: tau tokens per round for draft passes plus one pass over (mean nodes + 1) tokens.
            nodes, passes = res.mean_k, res.draft_calls / res.rounds
            verify = float(np.interp(nodes + 1, np.arange(1, len(r) + 1), r))  # r(nodes + 1)
            out["mean_nodes"], out["draft_passes_per_round"] = nodes, passes
            out["tree_verify_cost_ratio"] = verify
            out["tree_predicted_speedup"] = res.tau / (c * passes + verify)
            return out
        k = round(k_mean)
        if k and not math.isnan(alpha):
            out["tau_expected"] = expected_tokens_per_round(alpha, k)  # from alpha and k alone
            out["verify_cost_ratio"] = r[k] if k < len(r) else math.nan  # r(k+1)
            out["predicted_speedup"] = predicted_speedup(alpha, k, c, r)
            out["predicted_speedup_if_r_were_1"] = predicted_speedup(alpha, k, c, None)
            # The same costs, priced over the rounds this run actually had.
            out["predicted_speedup_from_rounds"] = speedup_from_rounds(
                len(res.tokens), res.k_per_round, res.draft_steps, c, r
            )
            out["best_k"], out["best_k_speedup"] = best_k(alpha, c, r, k_max=len(r) - 1)
        policy = spec.k_policy
        if isinstance(policy, CostModelK):  # --K auto: what it would pick next, from its own estimate of alpha
            out["auto_alpha"], out["auto_k"] = policy.alpha, policy.next_k()
        return out

    def to_dict(self) -> dict:
        """Everything as plain JSON values (nan -> None), as main.py --json prints it."""
        out: dict = {"settings": dict(self.settings)}
        for name in DECODERS:
            run = getattr(self, "ar" if name == "autoregressive" else "spec")
            if run is None:
                continue
            r = run.result
            out[name] = {
                "seconds": run.seconds,
                "seconds_all_repeats": [x.seconds for x in getattr(self, name)],
                "tokens_per_second": run.tokens_per_second,
                "tokens": r.tokens,
                "target_calls": r.target_calls,
                "draft_calls": r.draft_calls,
                "tau": r.tau,
            }
            if self.tokenizer is not None:
                out[name]["text"] = self.tokenizer.decode(r.tokens)
            if name == "speculative":
                out[name].update({
                    "rounds": r.rounds, "prefill_calls": r.prefill_calls, "drafted": r.drafted,
                    "judged": sum(r.judged), "accepted": r.accepted, "alpha": r.alpha,
                    "acceptance_by_position": r.acceptance_by_position, "kinds": r.kinds,
                    "accepted_histogram": r.accepted_histogram, "mean_k": r.mean_k,
                    "draft_seconds": run.draft_seconds, "verify_seconds": run.verify_seconds,
                    "sampler_seconds": run.sampler_seconds,
                })  # fmt: skip
        c = self.costs
        out["costs"] = None if c is None else {
            "target_step_seconds": c.target_step, "draft_step_seconds": c.draft_step, "c": c.c, "r": c.r, "note": c.note,
        }  # fmt: skip
        if self.spec:
            out["summary"] = {"speedup": self.speedup, "speedup_is": self.speedup_label, "speedups": self.speedups,
                              "spread": list(self.spread), "margin": self.margin, "verdict": self.verdict,
                              "texts_identical": self.texts_identical, **self.explain()}  # fmt: skip
        return jsonable(out)

    def __str__(self) -> str:
        return "\n".join(self._timing_lines() + ["", "── summary " + "─" * 62] + self._summary_lines())

    def __repr__(self) -> str:
        """One line: RaceReport(speedup 1.42x, alpha 0.81, tau 3.10, K=4, 40 tokens)."""
        parts = [f"speedup {self.speedup:.2f}x"] if self.ar and self.spec else []
        run = self.spec or self.ar
        if self.spec:
            parts += [f"alpha {fmt(run.result.alpha)}", f"tau {fmt(run.result.tau)}"]
        parts += [f"K={self.settings.get('K')}"] if self.spec else []
        parts += [f"{len(run.result.tokens)} tokens"] if run else []
        return "RaceReport(" + ", ".join(parts) + ")"

    def _repr_html_(self) -> str:
        """In a notebook: the summary, then the speculative run's coloured trace."""
        out = f'<pre style="margin:0">{html.escape(str(self))}</pre>'
        if self.spec and self.tokenizer is not None:
            r = self.spec.result
            out += trace_html(token_pieces(self.tokenizer, r.tokens), r.kinds)
        return out

    def _timing_lines(self) -> list[str]:
        lines = []
        for name in DECODERS:
            run = getattr(self, "ar" if name == "autoregressive" else "spec")
            if run is None:
                continue
            r = run.result
            n = len(getattr(self, name))
            median = f", the median of {n} repeats" if n > 1 else ""
            line = (f"[{name}] {len(r.tokens)} tokens in {run.seconds:.2f} s ({run.tokens_per_second:.1f} tokens/s"
                    f"{median}), ")  # fmt: skip
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

    def _summary_lines(self) -> list[str]:
        c, spec = self.costs, self.spec
        if spec is None:
            ar = self.ar
            per_token = f"{ar.seconds / len(ar.result.tokens) * 1e3:.1f} ms" if ar and ar.result.tokens else "-"
            return [f"autoregressive: {per_token} per new token, the pass over the prompt included (no forward-pass "
                    "costs measured: they price speculative rounds, and none ran)"]  # fmt: skip
        costs = f"{c.c:.3f}  ({c.draft_step * 1e3:.1f} ms vs {c.target_step * 1e3:.1f} ms)"
        r, summary = spec.result, self.explain()
        tree = "tree_predicted_speedup" in summary  # a tree: one pass checks several candidates per depth
        prompt_pass = f"; +{plural(r.prefill_calls, 'pass')} over the prompt" if r.prefill_calls else ""
        predicted = summary.get("tree_predicted_speedup", summary.get("predicted_speedup", math.nan))
        rows = self._speedup_rows(predicted) if self.ar else []
        rows += [
            ("alpha (accepted / judged drafts)",
             f"{fmt(r.alpha)}  ({r.accepted} accepted of {sum(r.judged)} judged; {r.drafted} drafted)"),
            ("tau (tokens per round = per target pass)",
             f"{fmt(r.tau)}  ({plural(len(r.tokens), 'token')} in {plural(r.rounds, 'round')}{prompt_pass})"),
            (f"acceptance at {'depth' if tree else 'draft position'} 1..K",
             "  ".join(fmt(a) for a in r.acceptance_by_position) or "-"),
            ("rounds by drafts accepted (0, 1, ...)",
             f"{r.accepted_histogram}  {sparkline(r.accepted_histogram)}"),
            ("draft / target passes", f"{r.draft_calls} / {r.target_calls}"),
            ("cost of a draft step, c = draft / target", costs),
        ]  # fmt: skip
        if "tree_predicted_speedup" in summary:
            n = summary["mean_nodes"]
            rows += [
                ("mean tree nodes per round", f"{n:.2f}  ({summary['draft_passes_per_round']:.2f} draft passes)"),
                (f"target pass over {n + 1:.1f} tokens vs 1 token", fmtx(summary['tree_verify_cost_ratio'])),
                ("predicted speedup tau / (c * passes + r(nodes + 1))", fmtx(summary['tree_predicted_speedup'])),
            ]
        if "predicted_speedup" in summary:
            k = round(summary["mean_k"])
            best, drafting = summary["best_k"], sum(drafts > 0 for drafts in r.k_per_round)
            rows += [
                ("k, mean drafts per round that drafted",
                 f"{summary['mean_k']:.2f}  ({drafting} of {plural(r.rounds, 'round')} drafted)"),
                (f"target pass over k+1={k + 1} tokens vs 1 token", fmtx(summary['verify_cost_ratio'])),
                (f"tau expected from alpha, (1-a^{k + 1})/(1-a)", fmt(summary["tau_expected"])),
                ("predicted speedup from alpha, k, c and r", fmtx(summary['predicted_speedup'])),
                ("  ...from this run's own rounds", fmtx(summary['predicted_speedup_from_rounds'])),
                ("  ...if verifying cost one step (GPU-like)", fmtx(summary['predicted_speedup_if_r_were_1'])),
                ("best K for these costs and alpha",
                 "none: plain decoding wins" if best == 0 else f"{best} (predicted {fmtx(summary['best_k_speedup'])})"),
            ]  # fmt: skip
            if "auto_k" in summary:  # the same formula (best_k) on the policy's own alpha, which lags this run's
                policy, auto_k = spec.k_policy, summary["auto_k"]
                why = ("the best K above" if auto_k == best else
                       f"starts at {fmt(policy.prior_alpha)} and forgets {1 - policy.decay:.0%} a round, so on a short "
                       "run it lags the alpha above")  # fmt: skip
                rows.append(("--K auto: its running alpha -> its K", f"{fmt(summary['auto_alpha'])} -> {auto_k}  ({why})"))
        lines_after = [f"NOTE: the costs c and r(m): {self.costs.note}"] if self.costs.note else []
        problem = self.curve()[1]
        if problem:
            lines_after.append(f"NOTE: the recorded r(m) is implausible ({problem}), so the predictions above use it "
                               "capped at m, raised to at least 1 and made non-decreasing")  # fmt: skip
        if self.ar and "predicted_speedup" in summary and _far_apart(self.speedup, summary["predicted_speedup"]):
            lines_after.append(
                "NOTE: the measured and predicted speedups differ by more than 1.5x, so the timings are noisy "
                "(a busy machine?); more repeats (--repeats 5) take medians"
            )
        if self.settings.get("temperature") == 0 and self.ar:
            i = self.first_difference()
            same = "yes" if i is None else (
                f"NO: they differ from new token {i}. A float32 near-tie between the two best tokens can do "
                f"this (the two decoders round differently; --float64 removes it); a difference at a clear winner "
                f"is a bug")  # fmt: skip
            rows.append(("identical text at temperature 0", same))
        width = max(len(key) for key, _ in rows)
        return [f"{key:<{width}}  {value}" for key, value in rows] + lines_after


def race(
    target: CausalLM, draft, prompt, n_tokens: int, K=4,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, seed: int | None = 0,
    repeats: int = 3, warmup: bool = True, k_max: int = 8, decoders=DECODERS,
    on_token: TokenCallback | None = None, on_decoder: Callable[[str], None] | None = None, tree=None,
    chat: bool = False, on_status: Callable[[str], None] | None = None, verification: str = "token",
    allow_special: bool = False, cross_vocab: str | None = None, siblings: str | None = None,
) -> RaceReport:  # fmt: skip
    """Run both samplers `repeats` times on the same request, interleaved, and time them.

    prompt: token ids, or text when the target has a tokenizer. K: an int, "adaptive"
    (AdaptiveK from 4 within 1..k_max) or "auto" (the cost model picks k each round
    from the measured costs and the acceptance rate so far). decoders: which to run.
    on_token(token, kind) streams the first repeat, as in the samplers; on_decoder(name)
    is called before each decoder's streamed run. Every repeat uses the same seed, so
    repeats produce the same tokens and differ only in time: report.speedup is the median
    of the repeats' speedups, report.spread their range and report.verdict the call in words.
    tree: None (chains), a node budget N, or "auto" (costmodel.TreePolicy on the measured c and r).
    chat: the prompt is a user message to a chat model, and both decoders stop at the end of the reply.
    on_status(text) is told what the race is doing (measuring, warming up, which repeat), for a status
    line. Ctrl-C raises RaceInterrupted, whose .report holds the runs finished so far. verification:
    speculative_sample's: "token" or "block" for a chain, "token", "spectr" or "traversal" for a tree.
    siblings: "iid" or "without replacement", how a draft model or early exit draws a tree's children
    (make_drafter; "spectr" needs "iid"). allow_special=True: control
    strings typed in the text become control tokens; by default they are plain text. cross_vocab: a draft
    model with another tokenizer, "tli", "slem" or "slrs" (speculative_sample's).

        report = race(target, "ngram", "Alan Turing theorized that", 40, K="auto", repeats=3)
        print(report); report.speedup, report.spread, report.verdict
    """
    # Check the whole request before spending time on measurements.
    params = SamplingParams(temperature, top_k, top_p)
    request = prompt  # with chat=True the samplers get the text and wrap it themselves
    prompt = check_request(target, prompt, n_tokens, chat, allow_special)
    check_seed(seed)
    unknown = set(decoders) - set(DECODERS)
    if unknown or not decoders:
        raise ValueError(f"decoders must be some of {DECODERS}, got {tuple(decoders)}")
    run_speculative = "speculative" in decoders
    checked = make_drafter(draft, target, cross_vocab, siblings) if run_speculative else None  # heads are read once here
    if isinstance(checked, CrossVocabDrafter):
        checked.check(params)  # SLEM: greedy only
    if run_speculative:
        check_verification(verification, tree, "exact", getattr(checked, "siblings", None))
    if run_speculative:
        K = parse_k(K)  # a word or an int: each run gets a fresh policy
        make_tree_policy(tree, None, target)  # checks `tree`
    whole_number(k_max, "k_max", 1, K_LIMIT)
    whole_number(repeats, "repeats", 1)
    status = on_status or (lambda text: None)
    costs = None  # they price speculative rounds: measured only when some run
    if run_speculative:
        m_max = max(k_max, K if isinstance(K, int) else 0) + 1  # up to the widest verification pass
        if tree is not None:
            m_max = max(m_max, (tree if isinstance(tree, int) else TreePolicy(0.0).n_max) + 1)
        status(f"measuring the forward-pass costs (c and r(m) for m = 1..{m_max})")
        try:
            costs = measure_costs(target, checked, prompt, m_max=m_max, repeats=3)
        except KeyboardInterrupt:
            raise RaceInterrupted(None, "measuring the costs") from None
    settings = dict(prompt_tokens=len(prompt), n_tokens=n_tokens, draft=_name(draft), K=K, temperature=temperature,
                    top_k=top_k, top_p=top_p, seed=seed, repeats=repeats, tree=tree,
                    verification=verification, cross_vocab=cross_vocab, siblings=siblings)  # fmt: skip
    report = RaceReport(settings, costs, tokenizer=target.tokenizer)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, chat=chat,
                    allow_special=allow_special)  # fmt: skip
    if not chat:
        request = prompt

    def run_once(name: str, n: int, stream: TokenCallback | None) -> Run:
        if name == "autoregressive":
            start = time.perf_counter()
            result = autoregressive_sample(target, request, n, on_token=stream, **sampling)
            seconds = time.perf_counter() - start
            return Run(result, seconds, verify_seconds=seconds)
        drafter = make_drafter(draft, target, cross_vocab, siblings)
        k_policy = make_k_policy(K, k_max, costs=lambda: costs)
        tree_policy = TreePolicy(costs.c, costs.r) if tree == "auto" else tree  # learns afresh each run
        with (
            _Stopwatch(drafter, "propose") as drafting,
            _Stopwatch(target, "forward", skip_while=drafting) as verifying,
        ):
            start = time.perf_counter()
            result = speculative_sample(target, drafter, request, n, K=k_policy, on_token=stream, tree=tree_policy,
                                        verification=verification, **sampling)  # fmt: skip
            seconds = time.perf_counter() - start
        return Run(result, seconds, drafting.seconds, verifying.seconds, k_policy)

    order = [d for d in DECODERS if d in decoders]
    during = "warming up"
    try:
        if warmup:  # page in weights, start BLAS threads, fill allocator pools
            status("warming up: a short untimed run of each decoder")
            for name in order:
                run_once(name, min(4, n_tokens), None)
        # Repeats interleave the decoders, so a burst of other work or a slow drift hits both alike; the
        # order alternates (A B, B A, A B, ...) so neither always runs second, on warmer caches.
        for repeat in range(repeats):
            for name in order if repeat % 2 == 0 else order[::-1]:
                during = f"timing repeat {repeat + 1} of {repeats}: {name}"
                status(during)
                if repeat == 0 and on_decoder:
                    on_decoder(name)
                getattr(report, name).append(run_once(name, n_tokens, on_token if repeat == 0 else None))
    except KeyboardInterrupt:
        raise RaceInterrupted(report, during) from None
    return report


def fmtx(x: float) -> str:
    """A speedup: '1.42x', or '-' when there is none to show."""
    return fmt(x) + ("x" if fmt(x) != "-" else "")


def _far_apart(measured: float, predicted: float, factor: float = 1.5) -> bool:
    return measured > 0 and predicted > 0 and not 1 / factor <= measured / predicted <= factor


def _name(draft) -> str:
    """How a report names the draft: its spec string, or a model's name."""
    return draft if isinstance(draft, str) else getattr(draft, "name", type(draft).__name__)


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
