"""The cost model of speculative decoding (Leviathan et al., arXiv 2211.17192, section 3),
the K policies that decide how many tokens to draft each round, and the same for trees and batches.

Pure arithmetic, shared by the timing harness, the benchmark and `--K auto`. One file per shape
of round, every name importable from here (`from specdec.costmodel import verify_cost`):
    chain.py    the paper's formulas (tokens per round, a round's cost, predicted_speedup, best_k,
                verify_cost: r(m) from a measured curve) and the K policies (the KPolicy interface
                of interfaces.py): FixedK, AdaptiveK, CostModelK (config.Setup.k_policy makes one)
    trees.py    tokens per pass of a drafted tree (TreeAcceptance), the node budget that pays
                (TreePolicy), c from the models' weights (draft_step_cost), make_tree_policy
    batches.py  B rows per pass: the best k per batch size, and a batch run's rounds priced
    sizing.py   how many of a model-free drafter's ranked candidates pay for their verification (best_size),
                r(m) from a few measured points (PointsCurve), SmolLM2's 2-core curve

Notation (times are in units of one 1-token target forward step):
    alpha  acceptance rate: the chance a draft token is accepted, taken as the
           same i.i.d. chance at every position (the paper's simplifying assumption)
    k      draft tokens per round (the paper's gamma)
    c      cost of one draft step relative to one target step
    r(m)   cost of one target pass over m new tokens relative to one 1-token
           step. The paper assumes r(k+1) = 1 (a GPU has idle compute, so the
           verification pass is as fast as one step). On a CPU it is not:
           measure it (specdec.bench) and pass the curve in.

Layer: beside the round. May import NumPy, interfaces.py, verify/ (a tree's shape) and the
modules of costmodel/ itself; it measures nothing (timing.py does) and imports no model.
"""

from .batches import BatchPassTimes, batch_break_even, best_k_batch, speedup_from_batch_rounds
from .chain import (
    K_LIMIT,
    K_NAMES,
    AdaptiveK,
    CostModelK,
    FixedK,
    best_k,
    confidence_bar,
    drafts_judged,
    expected_tokens_per_round,
    predicted_speedup,
    round_cost,
    speedup_from_rounds,
    verify_cost,
)
from .sizing import SMOLLM2_CPU_R, PointsCurve, as_curve, best_size, curve_values, expected_tokens_by_size
from .trees import (
    CPU_R,
    OTHER_DRAFT_COST,
    ChainPolicy,
    FixedTree,
    TreeAcceptance,
    TreePolicy,
    draft_step_cost,
    make_tree_policy,
    predicted_tree_speedup,
)

__all__ = [
    # chains and K policies
    "K_LIMIT",
    "K_NAMES",
    "drafts_judged",
    "expected_tokens_per_round",
    "round_cost",
    "verify_cost",
    "predicted_speedup",
    "speedup_from_rounds",
    "best_k",
    "confidence_bar",
    "FixedK",
    "AdaptiveK",
    "CostModelK",
    # trees
    "TreeAcceptance",
    "predicted_tree_speedup",
    "TreePolicy",
    "CPU_R",
    "ChainPolicy",
    "FixedTree",
    "OTHER_DRAFT_COST",
    "draft_step_cost",
    "make_tree_policy",
    # ranked deterministic candidates
    "SMOLLM2_CPU_R",
    "PointsCurve",
    "as_curve",
    "curve_values",
    "best_size",
    "expected_tokens_by_size",
    # batches
    "best_k_batch",
    "batch_break_even",
    "BatchPassTimes",
    "speedup_from_batch_rounds",
]
