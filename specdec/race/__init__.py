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

This module runs the race and holds its statistics (the speedup per repeat, its spread,
the verdict, what the cost model predicts); render.py shows a report as text, JSON and HTML.

Layer: tooling above the round. May import model/, checkpoints/, drafters/ and the round's modules
(speculative.py, autoregressive.py, config.py, result.py, timing.py, costmodel/, verify/); the
command line and the benchmark import it, nothing below them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from . import render
from ..autoregressive import decode_autoregressive
from ..config import Config, Request, check_seed, make_config, make_rng, setup, whole_number
from ..costmodel import (
    CostModelK,
    best_k,
    expected_tokens_per_round,
    predicted_speedup,
    predicted_tree_speedup,
    speedup_from_rounds,
    verify_cost,
)
from ..drafters import LookupFirst
from ..model.base import CausalLM
from ..result import DecodeResult, TokenCallback
from ..speculative import decode_speculative
from ..timing import Costs, implausible, plausible

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
    def drafted_per_second(self) -> float:
        """Drafts proposed per second of the whole run: vLLM's "drafted throughput"."""
        return self.result.drafted / self.seconds if self.seconds else math.nan

    @property
    def accepted_per_second(self) -> float:
        """Drafts accepted per second of the whole run: vLLM's "accepted throughput"."""
        return self.result.accepted / self.seconds if self.seconds else math.nan

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
        or sampling gives the two decoders different lengths, the rates keep it fair. Their range is the
        spread; the speedup itself is the ratio of the two median runs (`speedup`)."""
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
    def rounds_only(self) -> bool:
        """Whether the speculative run is priced over its own rounds only, eq. 1 left out: with a draft confidence
        bar alpha is of the drafts the bar let through, the sure ones; with lookup first it mixes free looked-up
        drafts with the second drafter's, at two rates. Eq. 1 (every round drafting k drafts at one rate) would
        misprice either, and suffix decoding, which sizes every round by its own evidence (0 to 32 drafts)."""
        settings = self.settings
        return settings.get("draft_confidence_bar") is not None or any(
            settings.get(key) for key in ("lookup_first", "sizes_itself")
        )

    @property
    def speedup(self) -> float:
        """The median speculative run's tokens per second over the median autoregressive run's: the ratio of the
        two rates the summary prints, so a reader can check it (nan unless both decoders ran). It lies within
        the per-repeat speedups' range: if every repeat's speculative run beat its neighbour by a factor s,
        the median run does too (order statistics keep a pointwise order)."""
        if not (self.ar and self.spec):
            return math.nan
        return self.spec.tokens_per_second / self.ar.tokens_per_second

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
    def passes_bound(self) -> float:
        """The most the speculative run's passes allow over plain decoding, by the cost model on the measured c and
        r(m) (nan without a speculative run that had rounds). Plain decoding pays one target step a token; the
        speculative run paid r(k + 1) for each round's verification pass and c for each draft step
        (costmodel.speedup_from_rounds): tokens per step is the most it can be faster, before the sampler's own
        work. The prompt's pass, which both decoders make, is left out: it only draws a ratio towards 1, so the
        bound is at least 1 (when the passes saved nothing, plain decoding's prompt pass still costs the same).

        For example, 40 tokens in 36 rounds (4 tokens drafted in all) cost at least 36 steps: at most 1.11x.
        """
        spec = self.spec
        if spec is None or self.costs is None or not spec.result.rounds:
            return math.nan
        r, c, curve = spec.result, self.costs.c, self.curve()[0]
        return max(1.0, speedup_from_rounds(len(r.tokens), r.k_per_round, r.draft_steps, c, curve))

    @property
    def verdict(self) -> str:
        """ "faster", "slower" or "within noise": the speedup against 1x, give or take the margin; "noise" when the
        measured speedup exceeds what the passes allow (passes_bound) by more than the margin: no run is faster
        than its passes, so such a figure is the timings' noise, not a speed-up."""
        if not self.speedups:
            return "-"
        if self.speedup > self.passes_bound * (1 + self.margin):
            return "noise"
        if self.speedup > 1 + self.margin:
            return "faster"
        if self.speedup < 1 / (1 + self.margin):
            return "slower"
        return "within noise"

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
            "passes_bound": self.passes_bound,
            "depth_acceptance": res.acceptance_by_position,
        }
        if self.settings.get("tree") is not None and res.rounds:
            # A tree: tau tokens per round for draft passes plus one pass over (mean nodes + 1) tokens.
            nodes, passes = res.mean_k, res.draft_calls / res.rounds
            out["mean_nodes"], out["draft_passes_per_round"] = nodes, passes
            out["tree_verify_cost_ratio"] = verify_cost(nodes + 1, r)
            out["tree_predicted_speedup"] = predicted_tree_speedup(res.tau, nodes, c * passes, r)
            return out
        if res.rounds:  # the costs priced over the rounds this run actually had (even if none drafted)
            out["predicted_speedup_from_rounds"] = speedup_from_rounds(
                len(res.tokens), res.k_per_round, res.draft_steps, c, r
            )
            out["predicted_speedup_from_rounds_if_r_were_1"] = speedup_from_rounds(
                len(res.tokens), res.k_per_round, res.draft_steps, c, None
            )
        k = round(k_mean) if not math.isnan(k_mean) else 0
        if k:
            out["verify_cost_ratio"] = verify_cost(k + 1, r)
        if k and not math.isnan(alpha) and not self.rounds_only:
            out["tau_expected"] = expected_tokens_per_round(alpha, k)  # from alpha and k alone
            out["predicted_speedup"] = predicted_speedup(alpha, k, c, r)
            out["predicted_speedup_if_r_were_1"] = predicted_speedup(alpha, k, c, None)
            out["best_k"], out["best_k_speedup"] = best_k(alpha, c, r, k_max=len(r) - 1)
        policy = spec.k_policy
        if isinstance(policy, CostModelK):  # --K auto: what it would pick next, from its own estimate of alpha
            out["auto_alpha"], out["auto_k"] = policy.alpha, policy.next_k()
        return out

    def decoders_run(self) -> list[tuple[str, Run, list[Run]]]:
        """(name, median run, all runs) of each decoder that ran, in DECODERS order."""
        runs = [("autoregressive", self.ar, self.autoregressive), ("speculative", self.spec, self.speculative)]
        return [(name, run, all_runs) for name, run, all_runs in runs if run is not None]

    def to_dict(self) -> dict:
        """Everything as plain JSON values (nan -> None), as main.py --json prints it (render.to_dict)."""
        return render.to_dict(self)

    def __str__(self) -> str:
        return render.text(self)

    def __repr__(self) -> str:
        return render.one_line(self)

    def _repr_html_(self) -> str:
        return render.to_html(self)


def race(
    target: CausalLM,
    draft,
    prompt,
    n_tokens: int,
    K=None,
    temperature: float | None = None,
    *,
    seed: int | None = 0,
    repeats: int = 3,
    warmup: bool = True,
    decoders=DECODERS,
    on_token: TokenCallback | None = None,
    on_decoder: Callable[[str], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    request: Request | None = None,
    config: Config | None = None,
    **settings,
) -> RaceReport:
    """Run both samplers `repeats` times on the same request, interleaved, and time them.

    prompt, draft, K and any other setting of a Config (by name or config=): as speculative_sample's.
    decoders: which to run. Every repeat uses the same seed, so repeats produce the same tokens and
    differ only in time: report.speedup is the ratio of the two median runs' rates, report.spread the
    range of the repeats' own ratios and report.verdict the call in words. on_token(token, kind) streams
    the first repeat; on_decoder(name) is called before each decoder's streamed run; on_status(text) is
    told what the race is doing (for a status line). request: `prompt` made into a Request already
    (config.make_request). Ctrl-C raises RaceInterrupted, whose .report holds the runs finished so far.

        report = race(target, "ngram", "Alan Turing theorized that", 40, K="auto", repeats=3)
        print(report); report.speedup, report.spread, report.verdict
    """
    # Check the whole request, and build the drafter (reading any head files) and its costs, once for every run.
    check_seed(seed)
    unknown = set(decoders) - set(DECODERS)
    if unknown or not decoders:
        raise ValueError(f"decoders must be some of {DECODERS}, got {tuple(decoders)}")
    whole_number(repeats, "repeats", 1)
    config = make_config(config, K=K, temperature=temperature, **settings)
    run_speculative = "speculative" in decoders
    if not run_speculative:
        if config.draft_confidence is not None:
            raise ValueError(
                "draft_confidence cuts the speculative decoder's drafts: it needs 'speculative' in decoders"
            )
        config = replace(config, verification="token", cross_vocab=None, siblings=None, tree=None)
    status = on_status or (lambda text: None)
    try:  # the costs price speculative rounds: timed (once in this process) only when some run
        run = setup(
            target,
            draft if run_speculative else None,
            prompt,
            n_tokens,
            config,
            request,
            costs=run_speculative,
            say=lambda line: status(line),
        )
    except KeyboardInterrupt:
        raise RaceInterrupted(None, "measuring the costs") from None
    drafter, costs, request = run.drafter, run.costs, run.request
    settings = dict(
        prompt_tokens=len(request.prompt),
        n_tokens=n_tokens,
        draft=_name(draft),
        K=config.K,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        seed=seed,
        repeats=repeats,
        tree=config.tree,
        verification=config.verification,
        cross_vocab=config.cross_vocab,
        siblings=config.siblings,
        draft_confidence=config.draft_confidence,
        draft_confidence_bar=getattr(getattr(drafter, "stop", None), "bar", None),
        lookup_first=isinstance(drafter, LookupFirst),
        sizes_itself=hasattr(drafter, "r"),
    )
    report = RaceReport(settings, costs, tokenizer=target.tokenizer)

    def run_once(name: str, n: int, stream: TokenCallback | None) -> Run:
        one = replace(run, request=replace(request, n_tokens=n))  # the warm-up asks for fewer tokens
        rng = make_rng(seed, None)  # every run draws the same random numbers
        if name == "autoregressive":
            start = time.perf_counter()
            result = decode_autoregressive(target, one.request, rng, stream)
            seconds = time.perf_counter() - start
            return Run(result, seconds, verify_seconds=seconds)
        k_policy = one.k_policy()
        if k_policy is not None:
            one = replace(one, config=replace(config, K=k_policy))  # kept, to report its choices
        with (
            _Stopwatch(drafter, "propose") as drafting,
            _Stopwatch(target, "forward", skip_while=drafting) as verifying,
        ):
            start = time.perf_counter()
            result = decode_speculative(one, rng, stream)
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


def _name(draft) -> str:
    """How a report names the draft: its spec string, or a model's name."""
    return draft if isinstance(draft, str) else getattr(draft, "name", type(draft).__name__)
