"""Suffix decoding's rounds on the chat tasks, priced on an r(m) curve: settings compared without the clock.

    PYTHONPATH=. python docs/measure/suffix_priced.py [--curve smollm2|cheap] [--variant kept] [--variant rate] ...
    PYTHONPATH=. python docs/measure/suffix_priced.py --temperature 1 --seeds 3    # sampled replies

At temperature 0 a run's rounds are deterministic, so two settings of the drafter can be compared exactly: each
chat request (specdec/bench/chat_tasks.json) is decoded once per setting, the drafter deciding on the curve
given, and the run is priced on that curve as (tokens) / (sum over rounds of r(drafted + 1)), the prompt's pass
left out. The machine's load, which moves wall-clock runs of the same rounds by up to 50% here, does not enter.
With --temperature above 0 each request is decoded once per seed (1, 2, ...) and each run priced on its own rounds:
the target samples, so two settings no longer see the same reply, and the figures compare settings only on average.

Curves: "smollm2" is costmodel.SMOLLM2_CPU_R (r(2) = 1.59, measured on 2 cores under load 2); "cheap" is close to
what the same machine measured on a quiet day (r(2) = 1.1).

Variants (the settings tried and not kept live here, as patches of the drafter; "kept" is the drafter as it is):
    kept              drafters/suffix.py as shipped (the text, earlier outputs and the shipped datastore; a(L) from
                      L / (L + 2), L / (L + 1) for a match of a pair the datastore never saw, L / (L + 8) in the
                      datastore; at temperature > 0 L / (L + 4) for every match in the text or earlier outputs)
    greedy-priors     kept, but with the greedy priors at every temperature (the drafter before sampling had its own)
    before            the drafter before rare pairs: one a(L) per source, every prior L / (L + 2)
    text-only         the request's own text alone (what suffix_ceiling.py's oracle bounds)
    rate              best_size judges n by E[tokens] - rate r(n + 1), rate = the run's recent tokens per step
    datastore-prior:D the datastore's a(L) prior L / (L + D)
    rare-prior:D      a rare pair's a(L) prior L / (L + D)
    rare-start:A      a rare pair's prior L / (L + 2), but A for a match of 2-3 tokens
    text-prior:D      the text's and earlier outputs' a(L) priors L / (L + D), rare pairs' included
    fitted-prior      every a(L)'s prior the table measured on SmolLM2's replies (docs/measure/suffix_prior.py)
    carry:W           a(L) learned across the process's runs, a new run keeping at most W candidates' worth
    A+B               both settings, e.g. before+datastore-prior:8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import specdec
from specdec import drafters
from specdec.costmodel import SMOLLM2_CPU_R, curve_values, expected_tokens_by_size
from specdec.drafters import suffix, suffix_drafter

TASKS = os.path.join(os.path.dirname(__file__), "..", "..", "specdec", "bench", "chat_tasks.json")
CURVES = {"smollm2": SMOLLM2_CPU_R, "cheap": {1: 1.0, 2: 1.1, 3: 1.2, 5: 1.35, 9: 1.8, 17: 2.4, 33: 3.4}}
FITTED = (1 / 3, 0.619, 0.800, 0.897, 0.950, 0.980, 0.999)  # suffix_prior.py on the datastore's 832 replies


def with_prior(table_of):
    """Calibration.rate with the prior a0 read from table_of(calibration) (a bucket's value), or the kept one."""
    kept = suffix.Calibration.rate

    def rate(self, context):
        table = table_of(self)
        if table is None:
            return kept(self, context)
        b = self.bucket(context)
        return (self.hits[b] + self.prior_weight * table[b]) / (self.support[b] + self.prior_weight)

    return rate


def run_rate_rule(drafter) -> None:
    """The rate variant: the drafter counts each round's tokens and priced steps, and sizes by the gain rule."""
    drafter.made, drafter.spent, drafter.last = 4.0, 4.0, None
    propose, commit, values = drafter.propose, drafter.commit, drafter._r_values

    def sized(probs, r, n_max):
        """best_size's (n, speedup(n)), n maximising E[tokens] - rate * r(n + 1) instead of their ratio."""
        tau = expected_tokens_by_size(list(probs)[:n_max])  # [n + 1]
        cost = curve_values(r, len(tau))
        n = int(np.argmax(tau - max(1.0, drafter.made / drafter.spent) * cost))
        return n, float(tau[n] / cost[n])

    def counted_propose(ids, k, params, rng, nodes=None):
        out = propose(ids, k, params, rng, nodes)
        drafter.last = (len(ids), len(out))
        return out

    def counted_commit(ids, features):
        if drafter.last is not None:
            start, n = drafter.last
            made, steps = (len(ids) - start, values[n]) if n else (1, 1.0)
            drafter.made, drafter.spent = 0.9 * drafter.made + made, 0.9 * drafter.spent + steps
            drafter.last = None
        commit(ids, features)

    drafter.propose, drafter.commit, drafter.sized = counted_propose, counted_commit, sized


VARIANTS = (
    "kept",
    "before",
    "text-only",
    "rate",
    "datastore-prior",
    "rare-prior",
    "rare-start",
    "text-prior",
    "greedy-priors",
    "fitted-prior",
    "carry",
)


def prior_table(offset: float) -> tuple:
    """a0(L) = L / (L + offset) at each bucket's smallest L."""
    return tuple((1 << b) / ((1 << b) + offset) for b in range(suffix.Calibration.N_BUCKETS))


def variant_drafter(target, curve, variant: str, state: dict):
    """A suffix drafter set up as `variant` says (see the module), deciding on `curve`. state: a dict the runs of
    one variant share (carry keeps its calibrations there). Needs Calibration.rate patched by `with_prior`, as
    priced_runs does (a calibration without a table keeps the drafter's own prior)."""
    parts = dict(part.partition(":")[::2] for part in variant.split("+"))  # "rare-prior:0.5+rate": both
    unknown = set(parts) - set(VARIANTS)
    if unknown or "before" in parts and {"rare-prior", "rare-start"} & set(parts):
        raise SystemExit(f"{variant}: unknown ({', '.join(sorted(unknown))}), or before with a rare-pair prior")
    drafter = suffix.SuffixDrafter(target.n_vocab) if "text-only" in parts else suffix_drafter("", target)
    drafter.r = curve
    if "greedy-priors" in parts:  # a prior table set below still overrides it
        for cal in drafter.calibration.values():
            cal.sampled_offset = cal.greedy_offset
    rare = [f"{source}, rare pair" for source in ("text", "earlier")]
    if "before" in parts:  # one a(L) per source, all from L / (L + 2): no rare pairs
        for name in rare:
            drafter.calibration[name] = drafter.calibration[name.split(",")[0]]
        drafter.calibration["datastore"].table = prior_table(2)
    if "datastore-prior" in parts:
        drafter.calibration["datastore"].table = prior_table(float(parts["datastore-prior"]))
    if "rare-prior" in parts:
        for name in rare:
            drafter.calibration[name].table = prior_table(float(parts["rare-prior"]))
    if "rare-start" in parts:  # only a rare pair's match of 2-3 tokens (bucket 1) starts from the value given
        table = list(prior_table(2))
        table[1] = float(parts["rare-start"])
        for name in rare:
            drafter.calibration[name].table = tuple(table)
    if "text-prior" in parts:
        for name in ("text", "earlier", *rare):
            drafter.calibration[name].table = prior_table(float(parts["text-prior"]))
    if "fitted-prior" in parts:
        for cal in drafter.calibration.values():
            cal.table = FITTED
    if "rate" in parts:
        run_rate_rule(drafter)
        suffix.best_size = lambda probs, r, n_max, d=drafter: d.sized(probs, r, n_max)
    if "carry" in parts:
        width = float(parts["carry"])
        shared = state.setdefault("carried", drafter.calibration)
        for cal in shared.values():  # what earlier runs learned, weighted as at most W candidates
            for b in range(cal.N_BUCKETS):
                if cal.support[b] > width:
                    scale = width / cal.support[b]
                    cal.support[b], cal.hits[b] = cal.support[b] * scale, cal.hits[b] * scale
        drafter.calibration = shared
    return drafter


def priced_runs(target, requests, curve, variant: str, temperature: float = 0.0, seeds: int = 1) -> dict:
    """{(kind, i, seed): tokens / priced steps} for each request (and seed, at temperature > 0), the drafter set
    up as `variant` says. Every variant starts with no earlier outputs (the process's index is emptied), so at
    temperature 0 each reads the same ones."""
    values = curve_values(curve, 40)
    drafters._EARLIER.pop(target, None)
    kept_best_size, kept_rate = suffix.best_size, suffix.Calibration.rate
    suffix.Calibration.rate = with_prior(lambda cal: getattr(cal, "table", None))  # no table: the kept prior
    out, state = {}, {}
    try:
        for kind, i, prompt in requests:
            for seed in range(1, seeds + 1) if temperature > 0 else [0]:
                drafter = variant_drafter(target, curve, variant, state)
                result = specdec.speculative_sample(
                    target, drafter, prompt, 128, temperature=temperature, seed=seed, chat=True
                )
                out[kind, i, seed] = len(result.tokens) / sum(values[k] for k in result.k_per_round)
    finally:
        suffix.best_size = kept_best_size
        suffix.Calibration.rate = kept_rate
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--curve", choices=sorted(CURVES), default="smollm2")
    ap.add_argument("--tasks", default=TASKS, help="the chat requests (default: the bench's chat tasks)")
    ap.add_argument("--variant", action="append", help="a setting (see above); repeat to compare (default: kept)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    ap.add_argument("--seeds", type=int, default=1, help="runs per request at temperature > 0 (default: 1)")
    args = ap.parse_args(argv)
    if args.temperature < 0 or args.seeds < 1:
        ap.error("--temperature must be >= 0 and --seeds at least 1")
    target = specdec.load_model(args.target)
    with open(args.tasks) as f:
        categories = json.load(f)["categories"]
    requests = [(kind, i, p) for kind, entry in categories.items() for i, p in enumerate(entry["prompts"])]
    sampling = f"temperature {args.temperature}, seeds 1-{args.seeds}" if args.temperature > 0 else "greedy"
    print(f"{args.target}, {sampling}, up to 128 tokens, priced on the {args.curve} curve")
    for variant in args.variant or ["kept"]:
        priced = priced_runs(target, requests, CURVES[args.curve], variant, args.temperature, args.seeds)
        copy = [x for (kind, *_), x in priced.items() if kind != "free"]
        free = [x for (kind, *_), x in priced.items() if kind == "free"]
        print(
            f"{variant}: copy median {statistics.median(copy):.3f}x (mean {statistics.mean(copy):.3f}x); "
            f"free median {statistics.median(free):.3f}x, each " + ", ".join(f"{x:.2f}x" for x in free)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
