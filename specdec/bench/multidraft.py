"""Several drafts for one position: the optimal acceptance against what each exact rule reaches, on real rows.

    python -m specdec.bench --only multidraft                                  # the shipped family and SmolLM2
    python -m specdec.bench --only multidraft --models family --positions 40   # a quick look, offline

What it adds over the other sections: how much k candidates for one position can be worth at
best (verify.optimal_acceptance, the bound no exact rule passes; Sun et al., arXiv 2310.15141;
Hu et al., arXiv 2502.18779) and how close the rules come, with no coin flipped. For each
model and drafter, the target writes a few continuations at temperature T; at every position
of them, p is the target's row and q the drafter's (both filtered alike). Per position and k:
    alpha           sum min(p, q): one draft (k = 1), the chain's acceptance
    bound iid       optimal_acceptance(p, q, k): the best any exact rule can do with k i.i.d. drafts
    SpecTr          1 - (1 - beta)^k, SpecTr's k-sequential selection (verify.spectr_plan), i.i.d. drafts
    SpecInfer iid   sampled_tree's acceptance with k i.i.d. siblings, exactly (verify.specinfer_iid_acceptance)
    bound wor       optimal_acceptance(p, q, k, replacement=False): k drafts without replacement
    SpecInfer wor   sampled_tree's acceptance with siblings drawn without replacement (EAGLE's way):
                    the exact acceptance given the siblings (verify.specinfer_acceptance), averaged
                    over --draws draws of them per position (so ± a little)
All columns are means over positions; at every position the run asserts what is proven there (no
rule above the i.i.d. bound, SpecTr at least (1 - 1/e) of it). The without-replacement bound enumerates subsets of q's
support, so those columns need the rows filtered to at most 16 tokens: the `top_k` column says
which filter the row used (none: the full vocabulary, i.i.d. columns only).

A second table runs whole tree rounds (--tree nodes, depth --depth) with the family's draft model,
and for every other model with the first of --drafts:
SpecInfer with siblings drawn without replacement (the default drafter), SpecInfer and SpecTr
with i.i.d. siblings, traversal verification both ways, each on the same prompts and seeds: tau,
tokens per verification pass, realised (± one standard error over rounds) and expected from the
rows (verify.expected_accepted on each drafted tree, + 1: no coin flipped, so far less noisy), and
the time the rule itself takes per round (verify.verify on the round's logits, timed again in the
on_round callback). A third table judges the same drafted trees by every rule offered for them
(SpecTr only with i.i.d. siblings), from the rows: E[tau], P(accept the first position) and, for
that first position, the bound (verify.first_position_bound: with i.i.d. siblings always, without
replacement only when the rows keep at most 16 tokens). A script that prints numbers, not a test.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..cli import flags
from ..autoregressive import autoregressive_sample
from ..checkpoints import family
from ..checkpoints.load import load_model
from ..drafters import make_drafter
from ..sampling import SamplingParams, probabilities
from ..speculative import speculative_sample
from ..verify import (
    WOR_SUPPORT_MAX,
    accepted_law,
    draw_without_replacement,
    first_position_bound,
    optimal_acceptance,
    specinfer_acceptance,
    specinfer_iid_acceptance,
    spectr_acceptance,
    verify,
)
from .block import load, mean, stderr
from .prompts import load_prompts

COLUMNS = ("alpha", "bound_iid", "spectr", "specinfer_iid", "bound_wor", "specinfer_wor")


def draft_rows(target, drafter: str, draft_model, text: list[int]) -> np.ndarray:
    """[len(text), n_vocab] draft logits over the text: a draft model's, or the target's first L layers."""
    if drafter.startswith("early_exit:"):
        n_layer = int(drafter.split(":")[1])
        return target.forward(text, target.new_cache(len(text)), n_layer=n_layer)
    return draft_model(text)


def positions(target, drafter, draft_model, prompts, n_tokens, T, seed):
    """(p logits, q logits) [n_positions, n_vocab] each, at every position the target wrote at temperature T."""
    p_all, q_all = [], []
    for i, ids in enumerate(prompts):
        out = autoregressive_sample(target, ids, n_tokens, temperature=T, seed=seed + i)
        text = list(ids) + out.tokens
        rows = slice(len(ids) - 1, len(text) - 1)  # the rows that gave each new token
        p_all.append(target(text)[rows])
        q_all.append(draft_rows(target, drafter, draft_model, text)[rows])
    return np.concatenate(p_all), np.concatenate(q_all)


def measure(p_logits, q_logits, T: float, top_k: int | None, Ks, draws: int, seed: int) -> dict:
    """{k: {column: mean over positions}} for one filter; the wor columns only with top_k <= 16."""
    params = SamplingParams(T, top_k=top_k)
    p_rows, q_rows = probabilities(p_logits, params), probabilities(q_logits, params)
    rng = np.random.default_rng(seed)
    wor = top_k is not None and top_k <= WOR_SUPPORT_MAX
    values: dict = {k: {c: [] for c in COLUMNS} for k in Ks}
    for p, q in zip(p_rows, q_rows):
        if wor and np.count_nonzero(q) > WOR_SUPPORT_MAX:  # a tie at the k-th logit kept more tokens
            continue
        for k in Ks:
            v = values[k]
            v["alpha"].append(float(np.minimum(p, q).sum(dtype=np.float64)))
            v["bound_iid"].append(optimal_acceptance(p, q, k))
            v["spectr"].append(spectr_acceptance(p, q, k))
            v["specinfer_iid"].append(specinfer_iid_acceptance(p, q, k))
            # The never-worse checks that are theorems: no exact rule passes the bound, and SpecTr
            # reaches (1 - 1/e) of it (Sun et al., arXiv 2310.15141), position by position.
            bound, spectr = v["bound_iid"][-1], v["spectr"][-1]
            assert bound >= max(spectr, v["specinfer_iid"][-1]) - 1e-6, "a rule passed the i.i.d. bound"
            assert spectr >= (1 - 1 / np.e) * bound - 1e-6, "SpecTr fell below (1 - 1/e) of the bound"
            if wor:
                v["bound_wor"].append(optimal_acceptance(p, q, k, replacement=False))
                v["specinfer_wor"].append(
                    mean([specinfer_acceptance(p, *draw_without_replacement(q, k, rng)) for _ in range(draws)])
                )
    return {k: {c: mean(v) for c, v in values[k].items()} | {"positions": len(values[k]["alpha"])} for k in Ks}


TREE_RULES = {  # label -> (how the drafter draws siblings, verification)
    "SpecInfer, without replacement": ("without replacement", "token"),
    "SpecInfer, iid": ("iid", "token"),
    "SpecTr, iid": ("iid", "spectr"),
    "traversal, without replacement": ("without replacement", "traversal"),
    "traversal, iid": ("iid", "traversal"),
}
RULES_FOR = {"iid": ("token", "spectr", "traversal"), "without replacement": ("token", "traversal")}  # exact there


def tree_rounds(target, draft, prompts, n_tokens: int, T: float, nodes: int, depth: int, seed: int):
    """Whole tree rounds of every rule on the same prompts and seeds: (per rule, per sibling mode).

    draft: a draft model or "early_exit:L", drawing each tree's siblings as the rule needs.

    per rule {label: {"tau": realised tokens per drafted round, "expected": E[tau] of the rule on its own
    drafted trees (verify.expected_accepted + 1), "seconds": the rule's time per round}};
    per sibling mode {siblings: {verification: E[tau] on each tree drafted that way, in every run,
    "first " + verification: P(accept the first position), "bound": first_position_bound}}: every
    rule offered for those siblings judged on the same drafted trees, from the rows.
    """
    params = SamplingParams(T)
    per_rule = {}
    same = {s: {} for s in RULES_FOR}
    for label, (siblings, verification) in TREE_RULES.items():
        taus, expected, seconds = [], [], []
        timing_rng = np.random.default_rng(seed)
        on_same = same[siblings]

        def on_round(proposal, logits):
            if not len(proposal):
                return
            t0 = time.perf_counter()
            verify(proposal, logits, params, timing_rng, "exact", verification)
            seconds.append(time.perf_counter() - t0)
            p = probabilities(logits, params)  # [n + 1, n_vocab], filtered as the round filters it
            tree = (proposal.tokens, proposal.parents, proposal.q, p)
            for rule in RULES_FOR[siblings]:
                law = accepted_law(*tree, rule)
                e = 1 + float(law @ np.arange(len(law)))
                on_same.setdefault(rule, []).append(e)
                on_same.setdefault("first " + rule, []).append(1 - float(law[0]))
                if rule == verification:
                    expected.append(e)
            if siblings == "iid" or np.count_nonzero(p[0]) <= WOR_SUPPORT_MAX:
                on_same.setdefault("bound", []).append(first_position_bound(*tree))

        for i, ids in enumerate(prompts):
            drafter = make_drafter(draft, target, siblings=siblings)
            result = speculative_sample(
                target,
                drafter,
                ids,
                n_tokens,
                K=depth,
                tree=nodes,
                temperature=T,
                seed=seed + i,
                verification=verification,
                on_round=on_round,
            )
            taus += [n + 1 for k, n in zip(result.k_per_round, result.accepted_per_round) if k > 0]
        per_rule[label] = {"tau": taus, "expected": expected, "seconds": seconds}
    return per_rule, same


def print_tree_tables(target, draft, label: str, draft_label: str, prompts, args, temperatures) -> None:
    """The whole-round tables of one model and drafter: each rule's own runs, then every rule on the same trees."""
    print(
        f"\nWhole rounds: {label} with {draft_label}, trees of {args.tree} nodes, depth {args.depth}, "
        f"{args.prompts} prompts x {args.positions} tokens, seeds {args.seed}..{args.seed + args.prompts - 1}"
    )
    print("| T | rule | rounds | tau realised | E[tau] from the rows | rule time per round (ms) |")
    print("|---|---|---|---|---|---|")
    same_rows = []
    for T in temperatures:
        per_rule, same = tree_rounds(target, draft, prompts, args.positions, T, args.tree, args.depth, args.seed)
        for rule, r in per_rule.items():
            print(
                f"| {T} | {rule} | {len(r['tau'])} | {mean(r['tau']):.2f} ± {stderr(r['tau']):.2f} "
                f"| {mean(r['expected']):.3f} | {1e3 * mean(r['seconds']):.2f} |",
                flush=True,
            )
        same_rows += [(T, siblings, values) for siblings, values in same.items()]
    print(
        "\nThe same drafted trees judged by every rule offered for them (E[tau] and P(accept the first position) "
        "from the rows; bound: first_position_bound, '-' where the rows are too wide for it)"
    )
    print(
        "| T | siblings | trees | E[tau] SpecInfer | E[tau] SpecTr | E[tau] traversal "
        "| first: SpecInfer | first: SpecTr | first: traversal | first: bound |"
    )
    print("|" + "---|" * 10)
    for T, siblings, v in same_rows:
        cells = [
            v.get(c)
            for c in ("token", "spectr", "traversal", "first token", "first spectr", "first traversal", "bound")
        ]
        print(
            f"| {T} | {siblings} | {len(v['token'])} | "
            + " | ".join("-" if c is None else f"{mean(c):.3f}" for c in cells)
            + " |",
            flush=True,
        )


def main(argv=None) -> list[dict]:
    ap = flags.documented("python -m specdec.bench --only multidraft", __doc__)
    ap.add_argument(
        "--models",
        default="family,smollm2-135m",
        help="'family' (stdlib-6L, its 2-layer draft and early exit) and/or a Llama/GPT-2 name (default %(default)s)",
    )
    ap.add_argument(
        "--drafts",
        default="early_exit:29,early_exit:20",
        help="drafters for the models other than the family (default %(default)s)",
    )
    ap.add_argument("--temperatures", default="0.6,1.0", help="(default %(default)s)")
    ap.add_argument("--K", default="2,4,8", help="drafts per position (default %(default)s)")
    ap.add_argument(
        "--top_k",
        default="none,16",
        help="filters of both rows; 16 or fewer adds the without-replacement columns (default %(default)s)",
    )
    ap.add_argument("--prompts", type=int, default=3, help="prompts per setting (default %(default)s)")
    ap.add_argument("--positions", type=int, default=32, help="positions (new tokens) per prompt (default %(default)s)")
    ap.add_argument(
        "--draws",
        type=int,
        default=20,
        help="draws of the siblings per position for SpecInfer wor (default %(default)s)",
    )
    ap.add_argument(
        "--tree", type=int, default=8, help="nodes per tree in the whole-round table, 0: none (default %(default)s)"
    )
    ap.add_argument("--depth", type=int, default=4, help="tree depth in the whole-round table (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    Ks = [int(k) for k in args.K.split(",")]
    filters = [None if f == "none" else int(f) for f in args.top_k.split(",")]
    start, t0 = load(), time.perf_counter()
    print(
        f"load average {start:.2f} at the start; {args.prompts} prompts x {args.positions} positions per setting, "
        f"seeds {args.seed}..{args.seed + args.prompts - 1}"
    )
    print(
        "| model | drafter | T | top_k | k | positions | alpha (k=1) | bound iid | SpecTr | SpecInfer iid "
        "| bound wor | SpecInfer wor | gap SpecTr | gap SpecInfer iid | gap SpecInfer wor |"
    )
    print("|" + "---|" * 15)
    rows, tree_settings = [], []  # (target, draft, labels, prompts) for the whole-round tables
    for name in args.models.split(","):
        if name == "family":
            target, draft_model = load_model(family.TARGET), load_model(family.DRAFT)
            drafts = [family.DRAFT, f"early_exit:{family.EARLY_EXIT_LAYER}"]
            texts = [p["text"] for p in family.prompts()[: args.prompts]]
            label = family.TARGET
        else:
            target, draft_model, label = load_model(name), None, name
            drafts = args.drafts.split(",")
            suite = load_prompts()
            texts = [suite[kind][0] for kind in list(suite)[: args.prompts]]  # the first prompt of each kind
        prompts = [target.tokenizer.encode(t) for t in texts]
        tree_draft = draft_model if name == "family" else drafts[0]
        tree_settings.append((target, tree_draft, label, drafts[0], prompts))
        for drafter in drafts:
            for T in temperatures:
                p_logits, q_logits = positions(target, drafter, draft_model, prompts, args.positions, T, args.seed)
                for top_k in filters:
                    result = measure(p_logits, q_logits, T, top_k, Ks, args.draws, args.seed)
                    for k in Ks:
                        r = result[k] | {"model": label, "drafter": drafter, "T": T, "top_k": top_k, "k": k}
                        rows.append(r)
                        cells = [f"{r[c]:.3f}" if r[c] == r[c] else "-" for c in COLUMNS]
                        gaps = [
                            r["bound_iid"] - r["spectr"],
                            r["bound_iid"] - r["specinfer_iid"],
                            r["bound_wor"] - r["specinfer_wor"],
                        ]
                        print(
                            f"| {label} | {drafter} | {T} | {top_k or 'none'} | {k} | {r['positions']} | "
                            + " | ".join(cells)
                            + " | "
                            + " | ".join(f"{g:.3f}" if g == g else "-" for g in gaps)
                            + " |",
                            flush=True,
                        )
    for target, draft, label, draft_label, prompts in tree_settings if args.tree else []:
        print_tree_tables(target, draft, label, draft_label, prompts, args, temperatures)
    print(f"\nload average {load():.2f} at the end; {time.perf_counter() - t0:.0f} s", file=sys.stdout)
    return rows
