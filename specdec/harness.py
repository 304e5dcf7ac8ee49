"""The race: time autoregressive and speculative decoding on the same request, and
explain the result with the cost model of Leviathan et al. (arXiv 2211.17192, section 3).

The samplers never time themselves. This module wraps, for the duration of a
run, the target's forward pass and the drafter's `propose` with stopwatches,
so a speculative run's wall time splits into drafting, verifying and the
sampler's own work, without touching the sampler code.

    from specdec.harness import race
    result = race(target, draft, ids, n_tokens=64, K=4, repeats=3)
    result.speedup, result.explain()
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from .autoregressive import autoregressive_sample, check_request
from .costmodel import AdaptiveK, CostModelK, FixedK, best_k, expected_tokens_per_round, predicted_speedup
from .drafters import make_drafter
from .gpt2 import GPT2
from .result import DecodeResult
from .sampling import SamplingParams
from .speculative import speculative_sample


# ---------------------------------------------------------------------------
# Measuring forward-pass costs directly.
# ---------------------------------------------------------------------------


@dataclass
class Costs:
    """What one forward pass costs, measured at the request's context length."""

    target_step: float  # seconds for one 1-token target step
    draft_step: float  # seconds for one draft step (0 for the n-gram drafter)
    r: list[float]  # r[m-1] = time(target pass over m tokens) / target_step, m = 1..len(r)

    @property
    def c(self) -> float:
        """Draft step cost relative to a target step (the paper's c)."""
        return self.draft_step / self.target_step


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_costs(target: GPT2, draft, context: list[int], m_max: int = 9, repeats: int = 5) -> Costs:
    """Time 1..m_max-token target passes and one draft step after `context`.

    Each timed pass runs on top of a cache holding `context` and is rolled
    back afterwards, so every measurement sees the same context length.
    """
    cache = target.new_cache()
    drafter = make_drafter(draft, target) if draft is not None else None
    if drafter is not None:
        drafter.begin(target, cache, context)
    if len(context) > 1:
        _, hidden = target.forward(context[:-1], cache, last_only=True, return_hidden=True)
        if drafter is not None:
            drafter.commit(context, hidden)
    n = cache.length
    m_max = max(1, min(m_max, target.n_ctx - n))
    cache.reserve(n + m_max)  # so no timed pass includes the cache's growth
    tokens = [context[-1]] * m_max

    def target_pass(m):
        target.forward(tokens[:m], cache)
        cache.rollback(n)

    target_pass(1)  # warm-up
    per_m = [_median_time(lambda m=m: target_pass(m), repeats) for m in range(1, m_max + 1)]

    # One draft step, whatever the drafter: propose one token after the context, then
    # commit nothing new. A model drafter catches up on the context in the first
    # (untimed) call, then feeds one token per call; the n-gram drafter times its lookup.
    greedy, no_features = SamplingParams(0.0), np.zeros((0, target.n_embd), np.float32)

    def draft_step():
        if drafter is not None:
            drafter.propose(context, 1, greedy, None)
            drafter.commit(context, no_features)

    draft_step()
    draft_time = _median_time(draft_step, repeats)
    return Costs(target_step=per_m[0], draft_step=draft_time, r=[t / per_m[0] for t in per_m])


# ---------------------------------------------------------------------------
# Stopwatches around a run.
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# The race.
# ---------------------------------------------------------------------------


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


@dataclass
class RaceResult:
    autoregressive: list[Run] = field(default_factory=list)  # one per repeat
    speculative: list[Run] = field(default_factory=list)
    costs: Costs | None = None
    K: int | str = 4

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
        """Median autoregressive time / median speculative time (> 1: speculative is faster)."""
        if not (self.ar and self.spec):
            return math.nan
        return self.ar.seconds / self.spec.seconds

    @property
    def texts_identical(self) -> bool | None:
        if not (self.ar and self.spec):
            return None
        return self.ar.result.tokens == self.spec.result.tokens

    def explain(self) -> dict:
        """The measured speedup next to what the cost model predicts from measured parts."""
        spec = self.spec
        if spec is None or self.costs is None:
            return {}
        res, c, r = spec.result, self.costs.c, self.costs.r
        alpha = res.alpha
        k_mean = res.mean_k
        out = {
            "alpha": alpha,
            "acceptance_rate": res.acceptance_rate,
            "c": c,
            "r": r,
            "mean_k": k_mean,
            "tokens_per_round": len(res.tokens) / res.rounds if res.rounds else math.nan,
            "tokens_per_target_call": res.tokens_per_target_call,
            "measured_speedup": self.speedup,
        }
        k = round(k_mean)
        if k and not math.isnan(alpha):
            out["tokens_per_round_expected"] = expected_tokens_per_round(alpha, k)
            out["verify_cost_ratio"] = r[k] if k < len(r) else math.nan  # r(k+1)
            out["predicted_speedup"] = predicted_speedup(alpha, k, c, r)
            out["predicted_speedup_if_r_were_1"] = predicted_speedup(alpha, k, c, None)
            out["best_k"], out["best_k_speedup"] = best_k(alpha, c, r, k_max=len(r) - 1)
        return out


def race(
    target: GPT2,
    draft,
    prompt_ids,
    n_tokens: int,
    K: int | str = 4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = 0,
    repeats: int = 1,
    warmup: bool = True,
    k_max: int = 8,
    run_autoregressive: bool = True,
    run_speculative: bool = True,
    on_token=None,
) -> RaceResult:
    """Run both samplers `repeats` times on the same request and time them.

    K: an int, "adaptive" (AdaptiveK from K=4 within 1..k_max) or "auto" (the
    cost model picks k each round from measured costs and the acceptance rate
    so far). on_token(sampler_name, token, kind) streams the first repeat.
    Every repeat uses the same seed, so repeats produce the same tokens and
    differ only in time. Streamed text is printed inside the timed runs; both
    decoders pay for it, and for GPT-2-sized models it is negligible.
    """
    # Check the whole request before spending time on measurements.
    SamplingParams(temperature, top_k, top_p)
    prompt = check_request(target, prompt_ids, n_tokens)
    if run_speculative:
        make_drafter(draft, target)
        if K not in ("auto", "adaptive"):
            FixedK(K)  # the sampler's own check of an integer K
    out = RaceResult(K=K)
    m_max = max(k_max, K if isinstance(K, int) else 0) + 1  # up to the widest verification pass
    out.costs = measure_costs(target, draft if run_speculative else None, prompt, m_max=m_max, repeats=3)

    def k_policy():
        if K == "auto":
            return CostModelK(out.costs.c, out.costs.r, k_max=k_max)
        if K == "adaptive":
            return AdaptiveK(min(4, k_max), 1, k_max)
        return K

    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    if warmup:  # page in weights, start BLAS threads, fill allocator pools
        n_warm = min(4, n_tokens)
        if run_autoregressive:
            autoregressive_sample(target, prompt, n_warm, seed=seed, **settings)
        if run_speculative:
            speculative_sample(target, draft, prompt, n_warm, K=k_policy(), seed=seed, **settings)

    for repeat in range(repeats):
        stream = on_token if repeat == 0 else None
        if run_autoregressive:
            callback = (lambda t, kind: stream("autoregressive", t, kind)) if stream else None
            start = time.perf_counter()
            result = autoregressive_sample(target, prompt, n_tokens, seed=seed, on_token=callback, **settings)
            seconds = time.perf_counter() - start
            out.autoregressive.append(Run(result, seconds, verify_seconds=seconds))
        if run_speculative:
            callback = (lambda t, kind: stream("speculative", t, kind)) if stream else None
            drafter = make_drafter(draft, target)
            with (
                _Stopwatch(drafter, "propose") as drafting,
                _Stopwatch(target, "forward", skip_while=drafting) as verifying,
            ):
                start = time.perf_counter()
                result = speculative_sample(
                    target, drafter, prompt, n_tokens, K=k_policy(), seed=seed, on_token=callback, **settings
                )
                seconds = time.perf_counter() - start
            out.speculative.append(Run(result, seconds, drafting.seconds, verifying.seconds))
    return out


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
