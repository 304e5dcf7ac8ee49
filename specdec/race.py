"""The race: time autoregressive and speculative decoding on the same request, and
explain the result with the cost model of Leviathan et al. (arXiv 2211.17192, section 3).

The samplers never time themselves. For the duration of a run this module wraps
the target's forward pass and the drafter's `propose` with stopwatches, so a
speculative run's wall time splits into drafting, verifying and the sampler's
own work, without touching the sampler code. The costs c and r(m) come from
timing.measure_costs, the same stopwatch the benchmark uses.

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

from . import display
from .autoregressive import autoregressive_sample, check_request, check_seed, whole_number
from .costmodel import (
    K_LIMIT,
    TreePolicy,
    best_k,
    expected_tokens_per_round,
    make_k_policy,
    make_tree_policy,
    parse_k,
    predicted_speedup,
    speedup_from_rounds,
)
from .drafters import make_drafter
from .model.gpt2 import GPT2
from .result import DecodeResult, TokenCallback
from .sampling import SamplingParams
from .speculative import speculative_sample
from .timing import Costs, measure_costs
from .verify import VERIFICATION

DECODERS = ("autoregressive", "speculative")


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


@dataclass
class Run:
    """One timed run of one sampler."""

    result: DecodeResult
    seconds: float  # wall time of the whole sampler call
    draft_seconds: float = 0.0  # inside the drafter's propose()
    verify_seconds: float = 0.0  # inside full target forward passes (prefill included)

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
    costs: Costs
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
    def speedup(self) -> float:
        """Speculative tokens per second / autoregressive tokens per second, of the median runs (> 1: speculative
        is faster). With the same tokens (greedy, or a shared seed) this is the ratio of the times; where a chat
        reply ends early, or sampling gives the two decoders different lengths, the rates keep it fair."""
        if not (self.ar and self.spec):
            return math.nan
        return self.spec.tokens_per_second / self.ar.tokens_per_second

    @property
    def texts_identical(self) -> bool | None:
        return self.ar.result.tokens == self.spec.result.tokens if self.ar and self.spec else None

    def first_difference(self) -> int | None:
        """The index of the first new token where the two decoders differ (None if they agree)."""
        if not (self.ar and self.spec) or self.texts_identical:
            return None
        a, b = self.ar.result.tokens, self.spec.result.tokens
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def explain(self) -> dict:
        """The measured speedup next to what the cost model predicts from measured parts."""
        spec = self.spec
        if spec is None:
            return {}
        res, c, r = spec.result, self.costs.c, self.costs.r
        alpha, k_mean = res.alpha, res.mean_k
        out = {
            "alpha": alpha,
            "acceptance_rate": res.acceptance_rate,
            "c": c,
            "r": r,
            "mean_k": k_mean,
            "tokens_per_round": len(res.tokens) / res.rounds if res.rounds else math.nan,
            "tokens_per_target_call": res.tokens_per_target_call,
            "measured_speedup": self.speedup,
            "tau": res.tau,
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
            out["tokens_per_round_expected"] = expected_tokens_per_round(alpha, k)
            out["verify_cost_ratio"] = r[k] if k < len(r) else math.nan  # r(k+1)
            out["predicted_speedup"] = predicted_speedup(alpha, k, c, r)
            out["predicted_speedup_if_r_were_1"] = predicted_speedup(alpha, k, c, None)
            # The same costs, priced over the rounds this run actually had.
            out["predicted_speedup_from_rounds"] = speedup_from_rounds(
                len(res.tokens), res.k_per_round, res.draft_steps, c, r
            )
            out["best_k"], out["best_k_speedup"] = best_k(alpha, c, r, k_max=len(r) - 1)
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
                "tokens_per_target_call": r.tokens_per_target_call,
            }
            if self.tokenizer is not None:
                out[name]["text"] = self.tokenizer.decode(r.tokens)
            if name == "speculative":
                out[name].update({
                    "rounds": r.rounds, "drafted": r.drafted, "accepted": r.accepted,
                    "acceptance_rate": r.acceptance_rate, "alpha": r.alpha, "tau": r.tau,
                    "acceptance_by_position": r.acceptance_by_position, "kinds": r.kinds,
                    "accepted_histogram": r.accepted_histogram, "mean_k": r.mean_k,
                    "draft_seconds": run.draft_seconds, "verify_seconds": run.verify_seconds,
                    "sampler_seconds": run.sampler_seconds,
                })  # fmt: skip
        c = self.costs
        out["costs"] = {"target_step_seconds": c.target_step, "draft_step_seconds": c.draft_step, "c": c.c, "r": c.r}
        if self.spec:
            out["summary"] = {"speedup": self.speedup, "texts_identical": self.texts_identical, **self.explain()}
        return jsonable(out)

    def __str__(self) -> str:
        return "\n".join(self._timing_lines() + ["", "── summary " + "─" * 62] + self._summary_lines())

    def __repr__(self) -> str:
        """One line: RaceReport(speedup 1.42x, alpha 0.81, tau 3.10, K=4, 40 tokens)."""
        parts = [f"speedup {self.speedup:.2f}x"] if self.ar and self.spec else []
        run = self.spec or self.ar
        if self.spec:
            parts += [f"alpha {display.fmt(run.result.alpha)}", f"tau {display.fmt(run.result.tau)}"]
        parts += [f"K={self.settings.get('K')}"] if self.spec else []
        parts += [f"{len(run.result.tokens)} tokens"] if run else []
        return "RaceReport(" + ", ".join(parts) + ")"

    def _repr_html_(self) -> str:
        """In a notebook: the summary, then the speculative run's coloured trace."""
        out = f'<pre style="margin:0">{html.escape(str(self))}</pre>'
        if self.spec and self.tokenizer is not None:
            r = self.spec.result
            out += display.trace_html(display.token_pieces(self.tokenizer, r.tokens), r.kinds)
        return out

    def _timing_lines(self) -> list[str]:
        lines = []
        for name in DECODERS:
            run = getattr(self, "ar" if name == "autoregressive" else "spec")
            if run is None:
                continue
            r = run.result
            line = f"[{name}] {len(r.tokens)} tokens in {run.seconds:.2f} s ({run.tokens_per_second:.1f} tokens/s), "
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
        c = self.costs
        costs = f"{c.c:.3f}  ({c.draft_step * 1e3:.1f} ms vs {c.target_step * 1e3:.1f} ms)"
        spec = self.spec
        if spec is None:
            return [f"target step {c.target_step * 1e3:.1f} ms"]
        r, summary = spec.result, self.explain()
        if "tree_predicted_speedup" in summary:  # a tree: one pass checks several candidates per depth
            tau = ("tau: tokens per verification pass", f"{r.tau:.2f}")
            depth = ("acceptance by depth (1st, 2nd, ... drafted token)",
                     " ".join(f"{a:.2f}" for a in summary["depth_acceptance"]) or "-")  # fmt: skip
        else:
            tau = ("tau (tokens per round: accepted drafts + 1)", f"{r.tau:.2f}")
            depth = ("acceptance at draft position 1..K", "  ".join(display.fmt(a) for a in r.acceptance_by_position))
        rows = [("speedup (autoregressive time / speculative time)", f"{self.speedup:.2f}x")] if self.ar else []
        rows += [
            ("acceptance rate (accepted / drafted)", f"{r.acceptance_rate:.2f}  ({r.accepted} of {r.drafted})"),
            ("alpha (accepted / drafts actually judged)", f"{r.alpha:.2f}"),
            ("tokens per target pass",
             f"{r.tokens_per_target_call:.2f}  ({r.target_calls} passes incl. prompt, {r.rounds} rounds)"),
            tau,
            depth,
            ("accepted drafts per round (0..K histogram)",
             f"{r.accepted_histogram}  {display.sparkline(r.accepted_histogram)}"),
            ("draft / target passes", f"{r.draft_calls} / {r.target_calls}"),
            ("cost of a draft step, c = draft / target", costs),
        ]  # fmt: skip
        if "tree_predicted_speedup" in summary:
            n = summary["mean_nodes"]
            rows += [
                ("mean tree nodes per round", f"{n:.2f}  ({summary['draft_passes_per_round']:.2f} draft passes)"),
                (f"target pass over {n + 1:.1f} tokens vs 1 token", f"{summary['tree_verify_cost_ratio']:.2f}x"),
                ("predicted speedup tau / (c * passes + r(nodes + 1))", f"{summary['tree_predicted_speedup']:.2f}x"),
            ]
        if "predicted_speedup" in summary:
            k = round(summary["mean_k"])
            best = summary["best_k"]
            rows += [
                ("mean drafts per round, k", f"{summary['mean_k']:.2f}"),
                (f"target pass over k+1={k + 1} tokens vs 1 token", f"{summary['verify_cost_ratio']:.2f}x"),
                (f"expected tokens per round (1-a^{k + 1})/(1-a)",
                 f"{summary['tokens_per_round_expected']:.2f}  (measured {summary['tokens_per_round']:.2f})"),
                ("predicted speedup from these measurements", f"{summary['predicted_speedup']:.2f}x"),
                ("  ...from this run's own rounds", f"{summary['predicted_speedup_from_rounds']:.2f}x"),
                ("  ...if verifying cost one step (GPU-like)", f"{summary['predicted_speedup_if_r_were_1']:.2f}x"),
                ("best K for these costs and alpha",
                 "none: plain decoding wins" if best == 0 else f"{best} (predicted {summary['best_k_speedup']:.2f}x)"),
            ]  # fmt: skip
        lines_after = []
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
    target: GPT2, draft, prompt, n_tokens: int, K=4,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, seed: int | None = 0,
    repeats: int = 1, warmup: bool = True, k_max: int = 8, decoders=DECODERS,
    on_token: TokenCallback | None = None, on_decoder: Callable[[str], None] | None = None, tree=None,
    chat: bool = False, verification: str = "token",
) -> RaceReport:  # fmt: skip
    """Run both samplers `repeats` times on the same request and time them.

    prompt: token ids, or text when the target has a tokenizer. K: an int, "adaptive"
    (AdaptiveK from 4 within 1..k_max) or "auto" (the cost model picks k each round
    from the measured costs and the acceptance rate so far). decoders: which to run.
    on_token(token, kind) streams the first repeat, as in the samplers; on_decoder(name)
    is called before each decoder's streamed run. Every repeat uses the same seed, so
    repeats produce the same tokens and differ only in time. tree: None (chains), a node
    budget N, or "auto" (costmodel.TreePolicy on the measured c and r). chat: the prompt is a user
    message to a chat model, and both decoders stop at the end of the reply. verification: "token" or
    "block" (speculative_sample's: how a chain of drafts is judged).

        report = race(target, "ngram", "Alan Turing theorized that", 40, K="auto", repeats=3)
        print(report); report.speedup
    """
    # Check the whole request before spending time on measurements.
    SamplingParams(temperature, top_k, top_p)
    if verification not in VERIFICATION or (verification == "block" and tree is not None):
        raise ValueError(f"verification must be 'token' or 'block' (block: chains only, no tree), got {verification!r}")
    request = prompt  # with chat=True the samplers get the text and wrap it themselves
    prompt = check_request(target, prompt, n_tokens, chat)
    check_seed(seed)
    unknown = set(decoders) - set(DECODERS)
    if unknown or not decoders:
        raise ValueError(f"decoders must be some of {DECODERS}, got {tuple(decoders)}")
    run_speculative = "speculative" in decoders
    checked = make_drafter(draft, target) if run_speculative else None  # heads are read from disk once here
    if run_speculative:
        K = parse_k(K)  # a word or an int: each run gets a fresh policy
        make_tree_policy(tree, None, target)  # checks `tree`
    whole_number(k_max, "k_max", 1, K_LIMIT)
    whole_number(repeats, "repeats", 1)
    m_max = max(k_max, K if isinstance(K, int) else 0) + 1  # up to the widest verification pass
    if tree is not None:
        m_max = max(m_max, (tree if isinstance(tree, int) else TreePolicy(0.0).n_max) + 1)
    costs = measure_costs(target, checked, prompt, m_max=m_max, repeats=3)
    settings = dict(prompt_tokens=len(prompt), n_tokens=n_tokens, draft=_name(draft), K=K, temperature=temperature,
                    top_k=top_k, top_p=top_p, seed=seed, repeats=repeats, tree=tree,
                    verification=verification)  # fmt: skip
    report = RaceReport(settings, costs, tokenizer=target.tokenizer)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, chat=chat)
    if not chat:
        request = prompt

    def run_once(name: str, n: int, stream: TokenCallback | None) -> Run:
        if name == "autoregressive":
            start = time.perf_counter()
            result = autoregressive_sample(target, request, n, on_token=stream, **sampling)
            seconds = time.perf_counter() - start
            return Run(result, seconds, verify_seconds=seconds)
        drafter = make_drafter(draft, target)
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
        return Run(result, seconds, drafting.seconds, verifying.seconds)

    if warmup:  # page in weights, start BLAS threads, fill allocator pools
        for name in (d for d in DECODERS if d in decoders):
            run_once(name, min(4, n_tokens), None)
    for repeat in range(repeats):
        for name in (d for d in DECODERS if d in decoders):
            if repeat == 0 and on_decoder:
                on_decoder(name)
            getattr(report, name).append(run_once(name, n_tokens, on_token if repeat == 0 else None))
    return report


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
