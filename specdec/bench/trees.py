"""Token trees on this machine: what a tree pass costs, and what trees buy.

What it adds over specdec.bench: the tree-specific numbers. Like specdec.bench,
a script that prints tables (never a test).

Commands:
    python -m specdec.bench --only tree-r                          # r(N + 1) for N = 0..16 tree nodes, 124M and 355M
    python -m specdec.bench --only tree-tau --target 124M --draft ngram,early_exit:4
    python -m specdec.bench --only tree-tau --target stdlib-6L --draft stdlib-2L,early_exit:2,ngram

Sections (`python -m specdec.bench --only tree-r,tree-tau`):
    tree-r    time of one target pass over the root and N tree nodes (a breadth-first
           binary tree, with its mask) and over a chain of the same length,
           relative to a 1-token step, at context 256, on GPT-2-shaped random weights
    tree-tau  speculative decoding with chains and trees (--trees) at --temperatures:
           tau (tokens per verification pass), acceptance by depth, nodes drafted
           per round, and the wall-time speedup over autoregressive decoding of the
           same request. Targets and drafts: a GPT-2 shape name (random weights:
           meaningful times, meaningless acceptance) or anything load_model takes.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..cli import flags
from ..autoregressive import autoregressive_sample
from ..checkpoints.load import load_model
from ..drafters.specs import parse_draft
from ..model.base import CausalLM
from ..model.gpt2 import GPT2, random_weights
from ..speculative import speculative_sample
from ..timing import time_calls
from .progress import Progress, add_quiet
from .speed.common import SIZES, VERIFY_CTX, filled_cache, stats_ms, table

N_MAX = 16  # tree nodes per pass: up to 17 new tokens


def width_two_tree(n: int) -> list[int]:
    """Parents of a breadth-first binary tree of n nodes below the root (node i's parent: (i - 1) // 2)."""
    return [-1] + [(i - 1) // 2 for i in range(1, n)]


def measure_r(model: CausalLM, repeats: int, rng: np.random.Generator) -> dict:
    """{kind: {m: (r, stats)}} for passes over m = 1 .. N_MAX + 1 new tokens, as a chain and as root + tree."""
    cache = filled_cache(model, VERIFY_CTX, rng)
    cache.reserve(VERIFY_CTX + N_MAX + 1)
    tokens = [int(t) for t in rng.integers(0, model.n_vocab, N_MAX + 1)]
    calls = {}
    for m in range(1, N_MAX + 2):
        tree = [-1, *(p + 1 for p in width_two_tree(m - 1))] if m > 1 else None  # the root, then the nodes
        calls[("chain", m)] = lambda m=m: model.forward(tokens[:m], cache)
        calls[("tree", m)] = lambda m=m, tree=tree: model.forward(tokens[:m], cache, parents=tree)
    times = time_calls(calls, repeats, rng, after=lambda key: cache.rollback(VERIFY_CTX))
    one = np.asarray(times[("chain", 1)])
    return {
        kind: {
            m: (float(np.median(np.asarray(times[(kind, m)]) / one)), stats_ms(times[(kind, m)]))
            for m in range(1, N_MAX + 2)
        }
        for kind in ("chain", "tree")
    }


def section_r(args, out) -> dict:
    results = {}
    rng = np.random.default_rng(args.seed)
    for size in args.sizes:
        args.progress(f"r: {size} shape, {args.repeats} repeats of each pass")
        model = GPT2(SIZES[size], random_weights(SIZES[size]), name=size)
        res = measure_r(model, args.repeats, rng)
        results[size] = {kind: [r for r, _ in res[kind].values()] for kind in res}
        rows = [
            [m - 1, res["tree"][m][1]["median_ms"], res["tree"][m][0], res["chain"][m][0]] for m in range(1, N_MAX + 2)
        ]
        table(
            out,
            f"r: a verification pass over the root and N tree nodes, {size}",
            f"median over {args.repeats} interleaved repeats at n_past={VERIFY_CTX}; r = time / time of a "
            f"1-token step; the chain of the same length for comparison",
            ["N nodes", "tree ms", "r(N+1) tree", "r(N+1) chain"],
            rows,
        )
    return results


def model(name: str, models_dir: str) -> CausalLM:
    """A GPT-2 shape name: random weights; anything else: load_model."""
    if name in SIZES:
        return GPT2(SIZES[name], random_weights(SIZES[name]), name=f"{name} (random weights)")
    return load_model(name, models_dir, progress=False)


def prompts_for(target: CausalLM, args) -> list[list[int]]:
    if target.tokenizer is None or args.prompt is None:
        rng = np.random.default_rng(args.seed)
        return [[int(t) for t in rng.integers(0, target.n_vocab, 16)] for _ in range(args.n_prompts)]
    return [target.tokenizer.encode(text) for text in args.prompt.split("|||")]


def section_tau(args, out) -> dict:
    target = model(args.target, args.models_dir)
    prompts = prompts_for(target, args)
    results, rows = [], []
    for temperature in args.temperatures:
        sampling = dict(temperature=temperature, seed=args.seed)
        start = time.perf_counter()
        for prompt in prompts:
            autoregressive_sample(target, prompt, args.n_tokens, **sampling)
        ar_seconds = time.perf_counter() - start
        for draft_name in args.drafts:
            draft = draft_name if parse_draft(draft_name).kind != "model" else model(draft_name, args.models_dir)
            for tree in args.trees:
                args.progress(f"tau: T={temperature:g}, draft {draft_name}, tree {tree}, {len(prompts)} prompts")
                tokens = accepted = drafted = rounds = 0
                depth_hits, depth_tests = np.zeros(args.K), np.zeros(args.K)
                start = time.perf_counter()
                for prompt in prompts:
                    res = speculative_sample(target, draft, prompt, args.n_tokens, K=args.K, tree=tree, **sampling)
                    tokens += len(res.tokens)
                    rounds, accepted, drafted = rounds + res.rounds, accepted + res.accepted, drafted + res.drafted
                    for n, j in zip(res.accepted_per_round, res.judged_per_round):
                        depth_tests[: min(j, args.K)] += 1
                        depth_hits[: min(n, args.K)] += 1
                seconds = time.perf_counter() - start
                tau = (accepted + rounds) / rounds
                by_depth = [h / t for h, t in zip(depth_hits, depth_tests) if t]
                entry = dict(
                    temperature=temperature,
                    draft=draft_name,
                    tree=tree,
                    tau=tau,
                    depth_acceptance=by_depth,
                    nodes_per_round=drafted / rounds,
                    speedup=ar_seconds / seconds,
                    ms_per_token=1e3 * seconds / tokens,
                )
                results.append(entry)
                rows.append(
                    [
                        temperature,
                        draft_name,
                        "chain" if tree is None else tree,
                        tau,
                        " ".join(f"{a:.2f}" for a in by_depth[:6]),
                        drafted / rounds,
                        1e3 * seconds / tokens,
                        ar_seconds / seconds,
                    ]
                )
    table(
        out,
        f"tau: chains and trees, target {target.name}",
        f"{len(prompts)} prompts x {args.n_tokens} tokens, K={args.K} (a tree's depth), seed {args.seed}; "
        f"speedup = autoregressive time / speculative time of the same requests, one run each",
        ["T", "draft", "tree", "tau", "acceptance by depth", "nodes/round", "ms/token", "speedup"],
        rows,
    )
    return {"target": target.name, "runs": results}


SECTIONS = {"r": section_r, "tau": section_tau}


def tree_setting(text: str):
    return None if text in ("none", "chain") else text if text == "auto" else int(text)


def main(argv=None) -> dict:
    p = flags.documented("python -m specdec.bench --only tree-r|tree-tau", __doc__, 2)
    p.add_argument("--only", default="r", help=f"sections, from {','.join(SECTIONS)} (default r)")
    p.add_argument("--sizes", default="124M,355M", help="r: GPT-2 shapes (default 124M,355M)")
    p.add_argument("--repeats", type=int, default=15, help="r: timed repeats per pass (default 15)")
    p.add_argument("--target", default="124M", help="tau: the target (default 124M, random weights)")
    p.add_argument("--draft", default="ngram", help="tau: comma-separated drafts: models, ngram, early_exit:L")
    p.add_argument("--trees", default="none,4,8,auto", help="tau: comma-separated: none (chain), N, auto")
    p.add_argument("--temperatures", default="0,1", help="tau: comma-separated temperatures (default 0,1)")
    p.add_argument("--K", type=int, default=4, help="tau: chain length, and a tree's depth (default 4)")
    p.add_argument("--n-tokens", type=int, default=64, help="tau: tokens per request (default 64)")
    p.add_argument("--prompt", default=None, help="tau: prompts separated by '|||' (default: random ids)")
    p.add_argument("--n-prompts", type=int, default=3, help="tau: random prompts when --prompt is not given")
    p.add_argument("--models_dir", default="models")
    p.add_argument("--seed", type=int, default=0)
    add_quiet(p)
    args = p.parse_args(argv)
    args.progress = Progress("trees", args.quiet)
    args.sizes = [s.strip() for s in args.sizes.split(",")]
    args.drafts = [s.strip() for s in args.draft.split(",")]
    try:
        args.trees = [tree_setting(s.strip()) for s in args.trees.split(",")]
        args.temperatures = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        p.error("--trees takes none, N or auto; --temperatures numbers, comma-separated")
    bad = [s for s in args.sizes if s not in SIZES] + [s for s in args.only.split(",") if s not in SECTIONS]
    if bad:
        p.error(
            f"unknown size or section: {', '.join(bad)} (sizes: {', '.join(SIZES)}; sections: {', '.join(SECTIONS)})"
        )
    return {name: SECTIONS[name](args, sys.stdout) for name in args.only.split(",")}
