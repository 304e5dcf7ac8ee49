"""Timing forward passes: the one stopwatch behind the race, `K="auto"` and the benchmark.

The cost model (costmodel/; Leviathan et al., arXiv 2211.17192, section 3)
needs two things measured on this machine, in units of one 1-token target step:
    c      one draft step
    r(m)   one target pass over m new tokens (the paper assumes r = 1)

Machines are noisy (other processes, frequency changes, bursts of 10x), so the
calls being compared are interleaved: every repeat times each call once, in a
fresh shuffled order, and r(m) is the median over repeats of the ratio within
the repeat, t_m / t_1. A burst or a slow drift then hits all calls alike.

Even so a curve can come out impossible: r(8) = 20 says one pass over 8 tokens
cost more than 8 one-token steps, which would only take longer if it did more
work, and r(2) = 0.9 says a pass over 2 tokens cost less than a pass over 1.
measure_costs checks the curve (`implausible`: r(m) above m, below 1, or falling
where it must grow) and measures again, with more repeats, before anything uses
it; a curve that stays implausible is repaired (capped at m, at least 1, made
non-decreasing) and says so in Costs.note. The prompt passes through the model
once: every timed pass, in every measurement, rolls the cache back to it.

Timing takes a few seconds, longer than a short generation: `costs_for` times a
(target, draft) pair once per process and hands the same Costs to every later
call, race and batch that asks (K="auto", draft_confidence="auto", the race's
pricing). SPECDEC_KERNELS=measure times every call again; measure_costs always
times.
"""

from __future__ import annotations

import sys
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .drafters import NgramDrafter, SuffixDrafter, make_drafter
from .interfaces import features_asked, priced_drafter
from .model.attention import KVCache
from .model.base import CausalLM
from .model.fast.tuning import kernels_mode
from .sampling import SamplingParams


@dataclass
class Costs:
    """What one forward pass costs here, measured at one context length."""

    target_step: float  # seconds for one 1-token target step (median)
    draft_step: float  # seconds for one draft step (0 with nothing to draft)
    r: list[float]  # r[m-1] = time(target pass over m tokens) / target_step, m = 1..len(r); r[0] == 1
    note: str = ""  # what was implausible in the measurements and what was done about it ("" when nothing)

    @property
    def c(self) -> float:
        """Draft step cost relative to a target step (the paper's c)."""
        return self.draft_step / self.target_step


def time_calls(calls: dict, repeats: int, rng: np.random.Generator | None = None, after: Callable | None = None):
    """{key: [seconds, one per repeat]}: every call once per repeat, in a fresh shuffled order.

    One untimed warm-up call each first. `after(key)` runs untimed after each call
    (rolling a cache back, say).

        time_calls({"a": f, "b": g}, repeats=10)["a"]   # 10 timings of f, interleaved with g's
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    keys = list(calls)
    times: dict = {key: [] for key in keys}
    for key in keys:
        calls[key]()
        if after:
            after(key)
    for _ in range(repeats):
        for i in rng.permutation(len(keys)):
            key = keys[i]
            start = time.perf_counter()
            calls[key]()
            times[key].append(time.perf_counter() - start)
            if after:
                after(key)
    return times


def verify_curve(times: dict) -> list[float]:
    """r(m) = median over repeats of t_m / t_1, for m = 1 .. the widest pass timed (times from time_calls keyed
    by m); between two widths timed (timed_widths skips some), on the straight line joining them."""
    t1, widths = np.asarray(times[1]), sorted(k for k in times if isinstance(k, int))
    timed = [float(np.median(np.asarray(times[m]) / t1)) for m in widths]
    return [float(x) for x in np.interp(np.arange(1, widths[-1] + 1), widths, timed)]


def timed_widths(m_max: int) -> list[int]:
    """The pass widths measure_costs times: every m up to 9 (where K="auto" and trees choose), then 17, 33 and
    m_max, as r(m) bends less with m: a suffix drafter's 33 passes cost 11 timings, not 33.

    >>> timed_widths(5), timed_widths(33), timed_widths(20)
    ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 20])
    """
    return sorted({*range(1, min(m_max, 9) + 1), *(m for m in (17, 33) if m < m_max), m_max})


def pass_calls(model: CausalLM, cache: KVCache, m_values, token: int = 0) -> tuple[dict, Callable]:
    """Calls for time_calls: {m: a forward over m new tokens on top of `cache`} and the
    `after` that rolls the cache back, so every pass sees the same context length."""
    n = cache.length
    cache.reserve(n + max(m_values))  # so no timed pass includes the cache's growth
    calls = {m: (lambda m=m: model.forward([token] * m, cache)) for m in m_values}  # [m, n_vocab] logits
    return calls, (lambda key: cache.rollback(n))


# How far a measured r may stray before it is called implausible: a pass over m tokens may cost up to
# SLACK * m steps (r(m) is a median of ratios: a little above m is noise, 2.5x above it is not), and r may
# dip below its running maximum by up to 1 - 1/SLACK (a kernel can switch paths between two m).
SLACK = 1.25
RETRIES = 2  # measurements after the first, each with twice the repeats


def implausible(r: list[float]) -> str | None:
    """Why a measured r(m) curve cannot describe this machine, or None.

    >>> implausible([1.0, 1.1, 1.3, 1.6]) is None
    True
    >>> implausible([1.0, 1.2, 9.0])
    'r(3) = 9.0 is above 3: one pass over 3 tokens cost more than 3 one-token steps'
    >>> implausible([1.0, 0.9, 1.3])
    'r(2) = 0.90 is below 1: one pass over 2 tokens cost less than a 1-token step'
    """
    for m, x in enumerate(r, start=1):
        if x > SLACK * m:
            return f"r({m}) = {x:.1f} is above {m}: one pass over {m} tokens cost more than {m} one-token steps"
    for m, x in enumerate(r[1:], start=2):
        if x < 1:  # a pass over m tokens does all a 1-token step does, and more
            return f"r({m}) = {x:.2f} is below 1: one pass over {m} tokens cost less than a 1-token step"
    for m in range(2, len(r) + 1):
        top = max(r[: m - 1])
        if r[m - 1] * SLACK < top:
            return f"r({m}) = {r[m - 1]:.2f} is below r({r.index(top) + 1}) = {top:.2f}: a longer pass cost less"
    return None


def plausible(r: list[float]) -> list[float]:
    """r capped at m, at least 1 and non-decreasing: the least change that makes an implausible curve usable.

    >>> plausible([1.0, 0.9, 1.3, 9.0])
    [1.0, 1.0, 1.3, 4.0]
    """
    out = []
    for m, x in enumerate(r, start=1):
        out.append(min(max(x, out[-1] if out else 1.0), float(m)))
    return out


def measure_costs(target: CausalLM, draft, context: list[int], m_max: int = 9, repeats: int = 5, rng=None) -> Costs:
    """Time 1..m_max-token target passes and one draft step after `context`, interleaved; measure again
    (RETRIES times, doubling the repeats) while the r curve is implausible, and repair it if it stays so.

    draft: anything speculative_sample accepts, or None (nothing to draft). The draft
    step is the drafter's own `propose` of one token, whatever the drafter is: a
    model step, an early-exit step, an n-gram lookup; for a lookup-first drafter
    ("ngram+eagle"), its second drafter's step.

        costs = measure_costs(target, draft, ids)
        costs.c, costs.r, costs.note
    """
    calls, rollback = _pass_and_draft_calls(target, draft, context, m_max)  # the one pass over the prompt
    problems = []
    for attempt in range(RETRIES + 1):
        costs = _measure(calls, rollback, repeats * 2**attempt, rng)
        problem = implausible(costs.r)
        if problem is None:
            if problems:
                costs.note = f"measured again, as the first measurement was implausible ({problems[0]})"
            return costs
        problems.append(problem)
    costs.r = plausible(costs.r)
    costs.note = (
        f"r(m) stayed implausible over {RETRIES + 1} measurements ({problems[-1]}), so it was capped at m, "
        "raised to at least 1 and made non-decreasing; the machine is too busy for these timings"
    )
    return costs


def _pass_and_draft_calls(target: CausalLM, draft, context: list[int], m_max: int) -> tuple[dict, Callable]:
    """The calls measure_costs times, after one pass over the context: {m: a target pass over m tokens,
    "draft": one draft step}, and the `after` that rolls the target's cache back to the context."""
    cache = target.new_cache()
    drafter = make_drafter(draft, target) if draft is not None else None
    drafter = priced_drafter(drafter) if drafter is not None else None  # lookup first: its second drafter
    if drafter is not None:
        drafter.begin(target, cache, context)
    if len(context) > 1:
        asked = True if drafter is None else features_asked(drafter)
        _, hidden = target.forward(context[:-1], cache, last_only=True, return_hidden=asked)
        if drafter is not None:
            drafter.commit(context, hidden)
    m_max = max(1, min(m_max, target.n_ctx - cache.length))
    calls, rollback = pass_calls(target, cache, timed_widths(m_max), token=context[-1])

    # One draft step: propose one token after the context, then commit nothing new
    # (the drafter rolls back). A model drafter catches up on the context in the
    # untimed warm-up call, then feeds one token per call.
    greedy, no_features = SamplingParams(0.0), np.zeros((0, target.n_embd), np.float32)
    if drafter is not None:
        calls["draft"] = lambda: (drafter.propose(context, 1, greedy, None), drafter.commit(context, no_features))
    return calls, (lambda key: key != "draft" and rollback(key))


def _measure(calls: dict, after: Callable, repeats: int, rng) -> Costs:
    """One interleaved measurement of the passes and the draft step (measure_costs checks it)."""
    times = time_calls(calls, repeats, rng, after=after)
    draft_step = float(np.median(times["draft"])) if "draft" in times else 0.0
    return Costs(target_step=float(np.median(times[1])), draft_step=draft_step, r=verify_curve(times))


# Costs timed in this process: {target: {draft key: (the draft, the widest pass asked for, its Costs)}}. A draft's
# key is its spec; an object's its id(), kept alive beside its costs so the id is not reused, except a lookup's
# (LOOKUPS): what it needs is the target's r(m), and its own step (c) is a lookup that costs next to nothing
# whichever object makes it, so lookups share one key, their class's name, and nothing is kept alive for them; a
# caller making a drafter per run does not time the target per run.
LOOKUPS = (NgramDrafter, SuffixDrafter)
_TIMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
REPEATS = 3  # interleaved repeats of a timing (measure_costs measures again, with more, if the curve is implausible)


def costs_for(target: CausalLM, draft, drafter, context: list[int], m_max: int, say=None) -> Costs:
    """The costs of `target` with `draft` (the spec or object a caller passed; `drafter` what it was built
    into), timed once per process up to an m_max pass and reused afterwards; timed again for a wider pass,
    or on every call under SPECDEC_KERNELS=measure. say(line): told before a timing (default: stderr)."""
    lookup = isinstance(draft, LOOKUPS)
    key = draft if isinstance(draft, str) else type(draft).__name__ if lookup else id(draft)
    timed = _TIMED.setdefault(target, {})
    _, widest, costs = timed.get(key, (None, 0, None))
    if costs is None or m_max > widest or kernels_mode() == "measure":
        say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        say(f"measuring the forward-pass costs (c and r(m) for m = 1..{m_max}; once in this process)")
        costs = measure_costs(target, drafter, context, m_max=m_max, repeats=REPEATS)
        timed[key] = (None if lookup else draft, m_max, costs)
    return costs
