"""Several drafts for one position: the optimal-acceptance bound, SpecTr's selection, and tree rules judged exactly.

1. optimal_acceptance against two independent computations on tiny vocabularies: the min-cut
   (every token set H, the drafts' law enumerated tuple by tuple) and the max-flow (the
   coupling LP's primal, by augmenting paths), with and without replacement.
2. The exact law of one round, by enumeration: every drafted tree (siblings i.i.d. or without
   replacement, 2-4 nodes, V = 3-4), every path the rule can take, every emitted token. The
   round continued by the target must give the target's own law (to 1e-8 in float64 here);
   deliberately broken rules must not. The node laws read the library's own plan (spectr_plan);
   traversal verification's law is enumerated with the library's own update (traversal_update),
   and never accepts fewer tokens per round than SpecInfer on these trees.
3. Each rule's acceptance at one node never exceeds the bound; SpecTr's within (1 - 1/e) of it.
4. The sampling functions draw what the node laws say, and the whole sampler with
   verification="spectr" or "traversal" reproduces the target on tiny models, the family and SmolLM2
   with top-k (chi-square, a broken control failing the same
   test); greedy decoding with it equals autoregressive greedy; bad combinations are refused.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from block_rules import World, completed_law, generic_block_plan
from block_rules import round_law as block_round_law
from helpers import PROMPT, chi_square_passes, exact_continuations, sample_many

from specdec import autoregressive_sample, load_model, speculative_sample, verify
from specdec.drafters import EarlyExitDrafter, ModelDrafter
from specdec.model.gpt2 import GPT2, HParams, random_weights
from specdec.sampling import SamplingParams, probabilities
from specdec.verify import (
    accepted_law,
    children_of,
    optimal_acceptance,
    sampled_tree,
    specinfer_acceptance,
    specinfer_iid_acceptance,
    spectr_acceptance,
    spectr_plan,
    spectr_tree,
    traversal_tree,
    traversal_update,
)

EXACT = 1e-8


# --- 1. the bound, three ways ----------------------------------------------------------------------


def draft_tuples(q: np.ndarray, k: int, replacement: bool):
    """Every ordered tuple of k drafts from q with its probability (without replacement: successive draws)."""
    k = k if replacement else min(k, int(np.count_nonzero(q)))
    for xs in itertools.product(range(len(q)), repeat=k):
        if not replacement and len(set(xs)) < k:
            continue
        prob, used = 1.0, 0.0
        for x in xs:
            prob *= q[x] / (1 if replacement else 1 - used)
            used += q[x]
        if prob > 0:
            yield xs, prob


def min_cut(p, q, k, replacement) -> float:
    """min over all token sets H of p(H) + P(some draft outside H), by enumeration."""
    tuples = list(draft_tuples(q, k, replacement))
    best = np.inf
    for bits in itertools.product([0, 1], repeat=len(p)):
        H = {y for y, b in enumerate(bits) if b}
        best = min(best, sum(p[y] for y in H) + sum(pr for xs, pr in tuples if not set(xs) <= H))
    return best


def max_flow(p, q, k, replacement) -> float:
    """The coupling LP's primal: the largest mass that can flow tuple -> a token in it -> the target's p.

    Augmenting paths on the bipartite graph (Ford-Fulkerson with breadth-first search); capacities
    Q(tuple) into each tuple, p(y) out of each token, unbounded in between.
    """
    tuples = list(draft_tuples(q, k, replacement))
    n_t, V = len(tuples), len(p)
    source, sink, size = n_t + V, n_t + V + 1, n_t + V + 2
    cap = np.zeros((size, size))
    for i, (xs, pr) in enumerate(tuples):
        cap[source, i] = pr
        for y in set(xs):
            cap[i, n_t + y] = np.inf
    cap[n_t : n_t + V, sink] = p
    total = 0.0
    while True:
        parent = {source: None}
        frontier = [source]
        while frontier and sink not in parent:
            u = frontier.pop(0)
            for v in np.flatnonzero(cap[u] > 1e-15):
                if int(v) not in parent:
                    parent[int(v)] = u
                    frontier.append(int(v))
        if sink not in parent:
            return total
        path, v = [], sink
        while parent[v] is not None:
            path.append((parent[v], v))
            v = parent[v]
        push = min(cap[u, v] for u, v in path)
        for u, v in path:
            cap[u, v] -= push
            cap[v, u] += push
        total += push


def random_pair(rng, V):
    p = rng.dirichlet(np.full(V, 0.6))
    q = rng.dirichlet(np.full(V, 0.6))
    if rng.random() < 0.3:  # a token the draft never proposes
        q[rng.integers(V)] = 0
        q /= q.sum()
    return p, q


@pytest.mark.parametrize("replacement", [True, False], ids=["iid", "without-replacement"])
def test_the_bound_is_the_min_cut_and_the_max_flow(replacement):
    rng = np.random.default_rng(0 if replacement else 1)
    for case in range(40):
        V, k = int(rng.integers(2, 5)), int(rng.integers(1, 4))
        p, q = random_pair(rng, V)
        bound = optimal_acceptance(p, q, k, replacement)
        assert bound == pytest.approx(min_cut(p, q, k, replacement), abs=1e-9), case
        assert bound == pytest.approx(max_flow(p, q, k, replacement), abs=1e-9), case


def test_the_bound_for_one_draft_is_the_chain_rule_and_it_grows_with_k():
    rng = np.random.default_rng(2)
    for _ in range(50):
        p, q = random_pair(rng, int(rng.integers(2, 30)))
        alpha = float(np.minimum(p, q).sum())
        assert optimal_acceptance(p, q, 1) == pytest.approx(alpha, abs=1e-9)
        bounds = [optimal_acceptance(p, q, k) for k in (1, 2, 4, 8)]
        assert all(a <= b + 1e-12 for a, b in zip(bounds, bounds[1:])) and bounds[-1] <= 1 + 1e-12


def test_the_prefix_sweep_is_needed_and_ties_are_harmless():
    """The sweep over q/p prefixes against a sweep over p prefixes (wrong order): the wrong order
    overestimates somewhere; equal ratios (q = t p on several tokens) give the min-cut exactly."""
    rng, wrong = np.random.default_rng(3), 0.0
    for _ in range(100):
        p, q = random_pair(rng, 5)
        order = np.argsort(-p)
        sweep = np.concatenate([[0], np.cumsum(p[order])]) + 1 - np.concatenate([[0], np.cumsum(q[order])]) ** 3
        wrong = max(wrong, float(sweep.min()) - optimal_acceptance(p, q, 3))
    assert wrong > 0.01
    p = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    q = np.array([0.2, 0.4, 0.3 / 4, 0.15 / 4, 0.25 / 4]) / np.array([0.2, 0.4, 0.3 / 4, 0.15 / 4, 0.25 / 4]).sum()
    for k in (2, 3):
        assert optimal_acceptance(p, q, k) == pytest.approx(min_cut(p, q, k, True), abs=1e-12)


def test_without_replacement_needs_a_small_support():
    with pytest.raises(ValueError, match="top_k"):
        optimal_acceptance(np.full(20, 0.05), np.full(20, 0.05), 2, replacement=False)
    with pytest.raises(ValueError, match="at least 1"):
        optimal_acceptance(np.full(3, 1 / 3), np.full(3, 1 / 3), 0)


# --- 2. the exact law of one round ----------------------------------------------------------------
# A node law: (r, the children's tokens, their q rows) -> (P(the walk goes down to child i) for each i,
# the distribution of the token emitted when it goes to none). The round's law follows by recursion.


def spectr_node(r, tokens, q_rows, gamma_rule=None, residual_rule=None):
    """SpecTr's selection, from the library's spectr_plan (the switches break it for the controls)."""
    k = len(tokens)
    gamma, residual = spectr_plan(r, q_rows[0], k)
    if gamma_rule:
        gamma = gamma_rule(gamma)
    if residual_rule:
        residual = residual_rule(r, q_rows[0], gamma, k)
    accept = [min(1.0, r[x] / (gamma * q_rows[0][x])) for x in tokens]
    return accept, residual / residual.sum() if residual.sum() > 0 else r


def specinfer_node(r, tokens, q_rows, update=True):
    """SpecInfer's rule (verify.sampled_tree): the residual updated after each rejected sibling."""
    accept, current = [], np.asarray(r, np.float64)
    for x, q in zip(tokens, q_rows):
        accept.append(min(1.0, current[x] / q[x]))
        residual = np.maximum(current - q, 0)
        if update and residual.sum() > 0:
            current = residual / residual.sum()
    if not update:  # BROKEN: every sibling judged against r, one residual at the end
        current = np.maximum(r - q_rows[-1], 0)
        current = current / current.sum() if current.sum() > 0 else r
    return accept, current


def gamma_one(r, tokens, q_rows):
    """BROKEN: SpecTr with gamma = 1 (every draft accepted with min(1, p/q)), the residual clipped at 0."""
    return spectr_node(r, tokens, q_rows, gamma_rule=lambda g: 1.0)


def residual_without_c(r, tokens, q_rows):
    """BROKEN: the residual max(p - min(q, p/gamma), 0), forgetting that k drafts had a chance (c)."""
    return spectr_node(r, tokens, q_rows, residual_rule=lambda r, q, g, k: np.maximum(r - np.minimum(q, r / g), 0))


def no_residual_update(r, tokens, q_rows):
    return specinfer_node(r, tokens, q_rows, update=False)


def draft_trees(world: World, widths, siblings: str):
    """Every tree drafted with widths[d] children per node at depth d: (tokens, parents, paths, q rows, probability).

    siblings: "iid", "without replacement", or "distinct" (the draft's top tokens, each with a point-mass q row).
    """
    shape = []  # (parent, depth) per node, breadth first
    frontier = [-1]
    for width in widths:
        grown = []
        for parent in frontier:
            for _ in range(width):
                shape.append(parent)
                grown.append(len(shape) - 1)
        frontier = grown
    for tokens in itertools.product(range(world.V), repeat=len(shape)):
        paths, q_rows, prob = [], [], 1.0
        for i, parent in enumerate(shape):
            path = () if parent < 0 else paths[parent]
            row = world.q(path).astype(np.float64)
            if siblings == "without replacement":
                earlier = [tokens[j] for j in range(i) if shape[j] == parent]
                row = row.copy()
                row[earlier] = 0
                row = row / row.sum() if row.sum() > 0 else row
            elif siblings == "distinct":  # deterministic: the s-th most likely draft token, q a point mass on it
                s = sum(shape[j] == parent for j in range(i))
                row = np.eye(world.V)[np.argsort(-row, kind="stable")[s]]
            prob *= row[tokens[i]]
            paths.append(path + (tokens[i],))
            q_rows.append(row)
        if prob > 0:
            yield list(tokens), shape, paths, np.array(q_rows), prob


def round_law(world: World, widths, siblings: str, node_law) -> dict[tuple, float]:
    """{output: probability} of one round: a tree drafted from q, judged by node_law against p."""
    law: dict[tuple, float] = {}
    for tokens, parents, paths, q, prob in draft_trees(world, widths, siblings):
        p = [world.p(())] + [world.p(path) for path in paths]
        for key, v in node_rule_law(tokens, parents, q, p, node_law).items():
            law[key] = law.get(key, 0.0) + prob * v
    return law


def node_rule_law(tokens, parents, q, p, node_law) -> dict[tuple, float]:
    """{output: probability} of a node rule on one drafted tree (q: [n, V] its rows, p: [n + 1, V] target rows)."""
    law: dict[tuple, float] = {}
    children = children_of(parents)

    def walk(row: int, prefix: tuple, mass: float):
        r = np.asarray(p[row], np.float64)
        kids = children[row]
        accept, residual = node_law(r, [tokens[c] for c in kids], q[kids]) if kids else ([], r)
        left = mass
        for child, a in zip(kids, accept):
            walk(child + 1, prefix + (tokens[child],), left * a)
            left *= 1 - a
        for y in range(len(r)):
            if left * residual[y] > 0:
                law[prefix + (y,)] = law.get(prefix + (y,), 0.0) + left * residual[y]

    walk(0, (), 1.0)
    return law


def traversal_law(tokens, parents, q, p, update=None, carry=True) -> dict[tuple, float]:
    """{output: probability} of traversal verification (verify.traversal_tree) on one drafted tree.

    q: [n, V] the rows the nodes were drawn from; p: [n + 1, V] target rows, as traversal_tree reads
    them. Not a node law: a node's fate depends on the weight carried down to it and on its subtree,
    so the leaves-to-root traversal is followed exactly, branch by branch, with the library's update
    (or a broken one; carry=False weighs each child by its own ratio min(1, r/q), BROKEN).
    """
    update = update or traversal_update
    children = children_of(parents)

    def judge(row: int, prefix: tuple, w: float) -> tuple[dict, float]:
        """(P(accepted through this node, output) for each output, P(this node rejected))."""
        r = np.asarray(p[row], np.float64)
        out: dict[tuple, float] = {}
        left = 1.0  # P(every child so far rejected)
        for child in children[row]:
            x = tokens[child]
            ratio = r[x] / float(q[child, x])
            sub, rejected = judge(child + 1, prefix + (x,), min(1.0, (w if carry else 1.0) * ratio))
            for key, v in sub.items():
                out[key] = out.get(key, 0.0) + left * v
            left *= rejected
            w, r = update(w, r, np.asarray(q[child], np.float64))
        accept = 1.0 if row == 0 else w
        for y in np.flatnonzero(r > 0):
            out[prefix + (int(y),)] = out.get(prefix + (int(y),), 0.0) + left * accept * r[y]
        return out, left * (1 - accept)

    return judge(0, (), 1.0)[0]


def traversal_round_law(world: World, widths, siblings: str, update=None, carry=True) -> dict[tuple, float]:
    """{output: probability} of one round: a tree drafted from q, judged by traversal verification."""
    law: dict[tuple, float] = {}
    for tokens, parents, paths, q, prob in draft_trees(world, widths, siblings):
        p = [world.p(())] + [world.p(path) for path in paths]
        for key, v in traversal_law(tokens, parents, q, p, update, carry).items():
            law[key] = law.get(key, 0.0) + prob * v
    return law


def completed_error(world, widths, law) -> float:
    completed = completed_law(world, law, len(widths) + 1)
    return max(abs(v - world.target(s)) for s, v in completed.items())


def rule_round_law(world, widths, siblings, node_law) -> dict[tuple, float]:
    if node_law == "traversal":
        return traversal_round_law(world, widths, siblings)
    return round_law(world, widths, siblings, node_law)


def law_error(world, widths, siblings, node_law) -> float:
    return completed_error(world, widths, rule_round_law(world, widths, siblings, node_law))


def weight_kept(w, r, q):
    """BROKEN: the sequence residual, but w left as it was after a rejection (no sequence-level update)."""
    residual = np.maximum(w * r - q, 0)
    return w, residual / residual.sum() if residual.sum() > 0 else r


def weight_reset(w, r, q):
    """BROKEN: the sequence residual, but the parent's weight reset to 1 after a rejection, as token-wise."""
    return 1.0, traversal_update(w, r, q)[1]


def node_residual(w, r, q):
    """BROKEN: the node-wise residual norm(max(r - q, 0)) instead of the sequence residual norm(max(w r - q, 0))."""
    new_w, _ = traversal_update(w, r, q)
    residual = np.maximum(r - q, 0)
    return new_w, residual / residual.sum() if residual.sum() > 0 else r


class World64(World):
    """block_rules.World with float64 rows summing to 1, so that 1e-8 separates exact rules from rounding."""

    def _row(self) -> np.ndarray:
        return self.rng.dirichlet(np.full(self.V, self.sharpness))


WORLDS = [World64(V, seed) for V in (3, 4) for seed in range(3)]
TREES = [(2,), (3,), (1, 2), (2, 1)]  # 2, 3, 3 and 4 nodes
RULES = {  # rule -> (node law, the sibling draws its proof allows)
    "spectr": (spectr_node, ["iid"]),
    "specinfer": (specinfer_node, ["iid", "without replacement", "distinct"]),
    "traversal": ("traversal", ["iid", "without replacement", "distinct"]),
}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("widths", TREES, ids=str)
def test_one_round_has_exactly_the_target_law(rule, widths):
    node_law, modes = RULES[rule]
    for siblings in modes:
        for world in WORLDS if sum(widths) < 4 else WORLDS[::2]:
            assert law_error(world, widths, siblings, node_law) < EXACT, (rule, widths, siblings, world.V)


@pytest.mark.parametrize(
    "broken,siblings",
    [
        (gamma_one, "iid"),
        (residual_without_c, "iid"),
        (no_residual_update, "iid"),
        (spectr_node, "without replacement"),
    ],
    ids=["gamma-one", "residual-without-c", "residual-not-updated", "spectr-without-replacement"],
)
def test_every_broken_rule_has_a_different_law(broken, siblings):
    worst = max(law_error(world, (2, 1), siblings, broken) for world in WORLDS[:4])
    assert worst > 1e-3, f"{broken.__name__} with {siblings} siblings passed (error {worst:.1e})"


@pytest.mark.parametrize(
    "update,carry,siblings",
    [
        (weight_kept, True, "iid"),
        (weight_kept, True, "without replacement"),
        (weight_reset, True, "iid"),
        (node_residual, True, "iid"),
        (node_residual, True, "without replacement"),
        (None, False, "iid"),
    ],
    ids=[
        "weight-kept-iid",
        "weight-kept-wor",
        "weight-reset-iid",
        "node-residual-iid",
        "node-residual-wor",
        "weight-not-carried",
    ],
)
def test_every_broken_traversal_has_a_different_law(update, carry, siblings):
    worst = max(
        completed_error(world, widths, traversal_round_law(world, widths, siblings, update, carry))
        for world in WORLDS[:4]
        for widths in ((1, 2), (2, 1))
    )
    assert worst > 1e-3, f"broken traversal ({update}, carry={carry}) with {siblings} siblings passed ({worst:.1e})"


def test_traversal_on_a_chain_is_block_verification():
    """A chain of 3 drafts: traversal's law of one round is block verification's (Sun et al.), output by output."""
    for world in WORLDS[:3]:
        traversal = traversal_round_law(world, (1, 1, 1), "iid")
        block = block_round_law(world, generic_block_plan, 3)
        assert max(abs(traversal.get(key, 0.0) - block.get(key, 0.0)) for key in {*traversal, *block}) < EXACT


def expected_accepted(law: dict[tuple, float]) -> float:
    """Drafted tokens accepted per round (the emitted tokens minus the last), in expectation."""
    return sum(v * (len(key) - 1) for key, v in law.items())


@pytest.mark.parametrize("widths", TREES, ids=str)
def test_traversal_never_accepts_fewer_than_specinfer(widths):
    """On every enumeration tree, world and sibling mode, in expectation over the drafts. With one
    level (the root's weight is 1), or point-mass q rows (the carried weight is then the product of
    p along the path, as token-wise), the two rules accept alike; else traversal gains somewhere."""
    gain = 0.0
    for siblings in ("iid", "without replacement", "distinct"):
        for world in WORLDS if sum(widths) < 4 else WORLDS[::2]:
            traversal = expected_accepted(traversal_round_law(world, widths, siblings))
            specinfer = expected_accepted(round_law(world, widths, siblings, specinfer_node))
            print(f"{widths} {siblings} V={world.V}: traversal {traversal:.4f}, SpecInfer {specinfer:.4f}")
            assert traversal >= specinfer - 1e-12, (widths, siblings, world.V, traversal, specinfer)
            gain = max(gain, traversal - specinfer)
    assert gain > 1e-3 or widths[0] > 1 and len(widths) == 1, gain


def accepted_histogram(law: dict[tuple, float], depth: int) -> np.ndarray:
    """[depth + 1]: P(d drafted tokens accepted) from an enumerated law of outputs."""
    out = np.zeros(depth + 1)
    for key, v in law.items():
        out[len(key) - 1] += v
    return out


def enumerated_accepted_law(rule: str, tokens, parents, q, p, depth: int) -> np.ndarray:
    """The brute-force counterpart of verify.accepted_law: the enumerated law of outputs, by length."""
    if rule == "traversal":
        law = traversal_law(tokens, parents, q, p)
    else:
        law = node_rule_law(tokens, parents, q, p, spectr_node if rule == "spectr" else specinfer_node)
    return accepted_histogram(law, depth)


def each_node_alone(tokens, parents, q, p, verification) -> np.ndarray:
    """BROKEN: every node accepted with its path's prod min(1, p/q), as if its siblings did not compete."""
    depth = [0] * len(parents)
    at_least = {}
    for i, parent in enumerate(parents):
        depth[i] = depth[parent] + 1 if parent >= 0 else 1
        ratio = min(1.0, p[parent + 1][tokens[i]] / q[i][tokens[i]])
        at_least[i] = ratio * (at_least[parent] if parent >= 0 else 1.0)
    law = np.zeros(max(depth) + 1)
    for i in range(len(parents)):
        law[depth[i]] += at_least[i]
    law[0] = 1 - law[1:].sum()
    return law


def worst_accepted_law_error(accepted_law, widths) -> float:
    """The largest |accepted_law - enumeration| over every drafted tree, world and sibling mode of each rule."""
    worst = 0.0
    for rule, (_, modes) in RULES.items():
        for siblings in modes:
            for world in WORLDS[:3]:
                for tokens, parents, paths, q, _ in draft_trees(world, widths, siblings):
                    p = np.array([world.p(())] + [world.p(path) for path in paths])
                    want = enumerated_accepted_law(rule, tokens, parents, q, p, len(widths))
                    got = accepted_law(tokens, parents, q, p, rule if rule != "specinfer" else "token")
                    worst = max(worst, float(np.abs(got - want).max()))
    return worst


@pytest.mark.parametrize("widths", [(2,), (1, 2), (2, 1)], ids=str)
def test_accepted_law_of_each_rule_is_the_enumerated_one(widths):
    """verify.accepted_law, each rule's law of accepted drafts on one drafted tree, against enumeration."""
    assert worst_accepted_law_error(verify.accepted_law, widths) < EXACT


@pytest.mark.parametrize("broken", ["each-node-alone", "weight-reset", "spectr-gamma-one"])
def test_a_broken_accepted_law_fails_the_enumeration(broken, monkeypatch):
    law = verify.accepted_law
    if broken == "each-node-alone":
        law = each_node_alone
    elif broken == "weight-reset":
        monkeypatch.setattr(verify.multidraft, "traversal_update", weight_reset)
    else:
        monkeypatch.setattr(verify.multidraft, "spectr_plan", broken_spectr_plan)
    worst = worst_accepted_law_error(law, (2, 1))
    assert worst > 1e-3, f"{broken} passed (error {worst:.1e})"


def test_accepted_law_on_a_chain_is_the_chain_rules_law():
    """A chain of 3: traversal's law is block_plan's stop law, SpecInfer's is token-wise's prod min(1, p/q)."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(5), size=4), rng.dirichlet(np.ones(5), size=3)
        tokens, parents = [int(rng.choice(5, p=row)) for row in q], [-1, 0, 1]
        stop, _ = verify.block_plan(tokens, q, p)
        assert accepted_law(tokens, parents, q, p, "traversal") == pytest.approx(stop, abs=1e-6)
        at_least = verify.token_weights(tokens, q, p)  # [4]: P(at least i accepted)
        assert accepted_law(tokens, parents, q, p, "token") == pytest.approx(-np.diff(at_least, append=0), abs=1e-6)


def test_expected_accepted_averages_to_the_round_and_the_first_position_stays_below_its_bound():
    """Averaged over drafted trees, expected_accepted is the round's; one level, it stays below the bound."""
    for world in WORLDS[:3]:
        for widths in ((2,), (3,), (2, 1)):
            for rule, (node_law, modes) in RULES.items():
                for siblings in modes:
                    name = "token" if rule == "specinfer" else rule
                    average, first, bound = 0.0, 0.0, 0.0
                    for tokens, parents, paths, q, prob in draft_trees(world, widths, siblings):
                        p = np.array([world.p(())] + [world.p(path) for path in paths])
                        average += prob * verify.expected_accepted(tokens, parents, q, p, name)
                        first += prob * (1 - accepted_law(tokens, parents, q, p, name)[0])
                        bound = verify.first_position_bound(tokens, parents, q, p)  # the same for every tree
                    round_ = expected_accepted(rule_round_law(world, widths, siblings, node_law))
                    assert average == pytest.approx(round_, abs=1e-9), (world.V, widths, rule, siblings)
                    assert first <= bound + 1e-9, (world.V, widths, rule, siblings, first, bound)


# --- 3. acceptance at one node against the bound --------------------------------------------------


def enumerated_specinfer(p, q, k, replacement: bool) -> float:
    """P(SpecInfer accepts one of k drafts), exactly, by enumerating the drafts (node law of this file)."""
    total = 0.0
    for xs, prob in draft_tuples(q, k, replacement):
        rows = []
        for s in range(len(xs)):
            row = q.copy()
            if not replacement:
                row[list(xs[:s])] = 0
                row /= row.sum()
            rows.append(row)
        accept, _ = specinfer_node(p, list(xs), rows)
        total += prob * (1 - np.prod([1 - a for a in accept]))
        assert specinfer_acceptance(p, list(xs), np.array(rows)) == pytest.approx(1 - np.prod([1 - a for a in accept]))
    return total


def test_every_rule_stays_below_the_bound():
    rng = np.random.default_rng(4)
    for case in range(60):
        V, k = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        p, q = random_pair(rng, V)
        iid, wor = optimal_acceptance(p, q, k), optimal_acceptance(p, q, k, replacement=False)
        spectr = spectr_acceptance(p, q, k)
        specinfer = enumerated_specinfer(p, q, k, True)
        assert specinfer == pytest.approx(specinfer_iid_acceptance(p, q, k), abs=1e-9), case
        assert spectr <= iid + 1e-9 and specinfer <= iid + 1e-9, case
        assert enumerated_specinfer(p, q, k, False) <= wor + 1e-9, case
        assert spectr >= (1 - 1 / np.e) * iid - 1e-9, case  # SpecTr's guarantee for k-sequential selection


def test_spectr_takes_the_smallest_exact_gamma():
    """At the gamma spectr_plan returns, p - c min(q, p/gamma) >= 0 (exact); at every gamma below it on a
    grid, it is negative somewhere (c(gamma) > gamma), and at gamma = k it is always valid."""
    rng = np.random.default_rng(6)

    def c_of(p, q, gamma, k):
        beta = np.minimum(q, p / gamma).sum()
        return (1 - (1 - beta) ** k) / beta

    for case in range(300):
        V, k = int(rng.integers(2, 7)), int(rng.integers(1, 9))
        p, q = random_pair(rng, V)
        gamma, residual = spectr_plan(p, q, k)
        assert 1 <= gamma <= k and c_of(p, q, gamma, k) <= gamma + 1e-7 and c_of(p, q, k, k) <= k + 1e-9, case
        assert residual.sum() == pytest.approx((1 - np.minimum(q, p / gamma).sum()) ** k, abs=1e-7), case
        assert all(c_of(p, q, g, k) > g for g in np.linspace(1, gamma, 12)[:-1] if g < gamma - 1e-6), case


# --- 4. the sampling functions and the whole sampler ----------------------------------------------


def test_spectr_tree_and_sampled_tree_draw_what_the_node_laws_say():
    """One fixed tree (root: 3 i.i.d. children; the first has a child), 3000 rounds each, chi-square."""
    world = World(4, 7)
    rng = np.random.default_rng(5)
    tokens, parents = [1, 1, 3, 2], [-1, -1, -1, 0]
    q_root, q_below = world.q(()).astype(np.float64), world.q((1,)).astype(np.float64)
    q = np.array([q_root, q_root, q_root, q_below], np.float32)
    p = np.stack([world.p(()), world.p((1,)), world.p((1,)), world.p((3,)), world.p((1, 2))])
    for rule, node_law in ((spectr_tree, spectr_node), (sampled_tree, specinfer_node)):
        exact: dict = {}
        accept, residual = node_law(p[0].astype(np.float64), [1, 1, 3], q[:3].astype(np.float64))
        left = 1.0
        for child, a in enumerate(accept):
            if child == 0:  # node 0 has one child, node 3
                sub_accept, sub_residual = node_law(p[1].astype(np.float64), [2], q[3:].astype(np.float64))
                exact[((0, 3), "bonus")] = a * sub_accept[0]
                for y in range(4):
                    exact[((0,), y)] = a * (1 - sub_accept[0]) * sub_residual[y]
            else:
                exact[((child,), "bonus")] = left * a
            left *= 1 - a
        for y in range(4):
            exact[((), y)] = left * residual[y]
        samples = []
        for _ in range(3000):
            path, last = rule(tokens, parents, q, p, rng)
            samples.append((tuple(path), last if path in ([], [0]) else "bonus"))
        ok, stat, df = chi_square_passes(samples, exact)
        assert ok, f"{rule.__name__}: chi2={stat:.1f} df={df}"


def test_traversal_tree_draws_what_the_enumerated_law_says():
    """One fixed tree (root: 3 i.i.d. children, the first with a child of its own; float32 rows as
    the round hands them over), 4000 rounds against traversal_law, chi-square."""
    world = World(4, 7)
    rng = np.random.default_rng(8)
    tokens, parents = [1, 1, 3, 2], [-1, -1, -1, 0]
    q_root, q_below = world.q(()), world.q((1,))
    q = np.array([q_root, q_root, q_root, q_below], np.float32)
    p = np.stack([world.p(()), world.p((1,)), world.p((1,)), world.p((3,)), world.p((1, 2))]).astype(np.float32)
    exact = traversal_law(tokens, parents, q, p)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-6)
    samples = []
    for _ in range(4000):
        path, last = traversal_tree(tokens, parents, q, p, rng)
        samples.append(tuple(tokens[i] for i in path) + (last,))
    ok, stat, df = chi_square_passes(samples, exact)
    assert ok, f"traversal_tree: chi2={stat:.1f} df={df}"


def tiny_model(seed: int, n_vocab: int = 6, n_layer: int = 1) -> GPT2:
    h = HParams(n_vocab=n_vocab, n_ctx=16, n_embd=16, n_head=2, n_layer=n_layer)
    return GPT2(h, random_weights(h, seed=seed, scale=0.6), name=f"tiny{n_vocab}-{seed}")


def broken_spectr_plan(p, q, k):
    """BROKEN: gamma = 1 (each i.i.d. sibling accepted with min(1, p/q)), residual clipped at 0."""
    gamma, _ = spectr_plan(p, q, k)
    beta = float(np.minimum(q, p).sum())
    c = (1 - (1 - beta) ** k) / beta if beta > 0 else k  # beta = 0 (disjoint supports under top-k): the limit
    return 1.0, np.maximum(p - c * np.minimum(q, p), 0)


def spectr_run(target, draft, n, tree, K):
    def run(rng):
        return speculative_sample(
            target,
            ModelDrafter(draft, tree_width=2, siblings="iid"),
            PROMPT,
            n,
            K=K,
            temperature=1.0,
            rng=rng,
            tree=tree,
            verification="spectr",
        )

    return run


@pytest.mark.parametrize(
    "V,n,tree,K,n_ok",
    [(4, 2, 3, 1, 800), pytest.param(6, 3, 6, 2, 8000, marks=pytest.mark.slow)],
    ids=["V4-tree3", "V6-tree6"],
)
def test_the_spectr_sampler_reproduces_the_target(V, n, tree, K, n_ok, monkeypatch):
    target, draft = tiny_model(10, V), tiny_model(20, V)
    exact = exact_continuations(target, PROMPT, n, SamplingParams(1.0))
    run = spectr_run(target, draft, n, tree, K)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=n_ok), exact)
    assert ok, f"spectr: chi2={stat:.1f} df={df}"
    monkeypatch.setattr(verify.spectr, "spectr_plan", broken_spectr_plan)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=n_ok, seed=1), exact)
    print(f"broken SpecTr: chi2={stat:.1f} df={df}")
    assert not ok, f"the broken SpecTr passed (chi2={stat:.1f}, df={df})"


@pytest.mark.parametrize("siblings", ["without replacement", pytest.param("iid", marks=pytest.mark.slow)])
def test_the_traversal_sampler_reproduces_the_target(siblings, monkeypatch):
    """The whole sampler, EAGLE-2's dynamic trees from a draft model; a broken update fails the same test."""
    target, draft = tiny_model(10, 4), tiny_model(20, 4)
    exact = exact_continuations(target, PROMPT, 3, SamplingParams(1.0))

    def run(rng):
        return speculative_sample(
            target,
            ModelDrafter(draft, tree_width=2, siblings=siblings),
            PROMPT,
            3,
            K=2,
            temperature=1.0,
            rng=rng,
            tree=4,
            verification="traversal",
        )

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=1000), exact)
    assert ok, f"traversal: chi2={stat:.1f} df={df}"
    monkeypatch.setattr(verify.trees, "traversal_update", weight_reset)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=1000, seed=1), exact)
    print(f"broken traversal: chi2={stat:.1f} df={df}")
    assert not ok, f"the broken traversal passed (chi2={stat:.1f}, df={df})"


def filtered_continuations(model, prompt, n: int, params: SamplingParams) -> dict[tuple, float]:
    """P(continuation) for every n-token continuation the filtered target can write (top_k keeps it small)."""
    if n == 0:
        return {(): 1.0}
    row = probabilities(model(list(prompt))[-1:], params)[0]  # [n_vocab]
    out = {}
    for y in np.flatnonzero(row > 0):
        for rest, prob in filtered_continuations(model, [*prompt, int(y)], n - 1, params).items():
            out[(int(y), *rest)] = float(row[y]) * prob
    return out


@pytest.mark.slow  # minutes: 2 x 2000 runs of the family's models (4 min each on the loaded 2-core machine)
@pytest.mark.parametrize("rule", ["spectr", "traversal"])
def test_the_tree_rules_reproduce_the_family_target_with_top_k(rule, monkeypatch):
    """The shipped stdlib-6L target and its 2-layer draft, i.i.d. siblings, top_k = 3, T = 1: the law of
    3-token continuations (27 of them) against 2000 runs; the broken rule fails the same test."""
    target, draft = load_model("stdlib-6L"), load_model("stdlib-2L")
    prompt = target.tokenizer.encode("    def close(self):\n        self.")
    params = SamplingParams(1.0, top_k=3)
    exact = filtered_continuations(target, prompt, 3, params)

    def run(rng):
        return speculative_sample(
            target,
            ModelDrafter(draft, tree_width=3, siblings="iid"),
            prompt,
            3,
            K=2,
            temperature=1.0,
            top_k=3,
            rng=rng,
            tree=6,
            verification=rule,
        )

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=2000), exact)
    assert ok, f"{rule}: chi2={stat:.1f} df={df}"
    if rule == "spectr":
        monkeypatch.setattr(verify.spectr, "spectr_plan", broken_spectr_plan)
    else:
        monkeypatch.setattr(verify.trees, "traversal_update", weight_reset)
    samples = sample_many(run, n_samples=2000, seed=1)
    impossible = sum(exact.get(s, 0.0) <= 0 for s in samples)  # the weight-reset traversal writes some
    ok, stat, df = chi_square_passes(samples, exact) if not impossible else (False, np.inf, 0)
    print(f"broken {rule}: chi2={stat:.1f} df={df}, {impossible} continuations the target cannot write")
    assert not ok, f"the broken {rule} passed (chi2={stat:.1f}, df={df})"


def test_greedy_with_every_tree_rule_is_greedy_autoregressive():
    target, draft = tiny_model(11, 6, n_layer=2), tiny_model(20, 6, n_layer=2)
    prompt = [1, 2, 1, 2, 3, 1, 2]
    want = autoregressive_sample(target, prompt, 8, temperature=0.0).tokens
    for verification in ("token", "spectr", "traversal"):
        for drafter in (ModelDrafter(draft, siblings="iid"), EarlyExitDrafter(target, 1, siblings="iid")):
            got = speculative_sample(
                target, drafter, prompt, 8, K=3, tree=5, temperature=0.0, verification=verification
            )
            assert got.tokens == want, verification


def test_spectr_and_traversal_are_offered_only_where_exact():
    target, draft = tiny_model(10), tiny_model(20)
    iid = ModelDrafter(draft, siblings="iid")
    with pytest.raises(ValueError, match="i.i.d."):  # draws without replacement
        speculative_sample(target, draft, PROMPT, 3, tree=4, temperature=1.0, verification="spectr")
    with pytest.raises(ValueError, match="i.i.d."):  # deterministic n-gram candidates
        speculative_sample(target, "ngram", PROMPT, 3, tree=4, temperature=1.0, verification="spectr")
    with pytest.raises(ValueError, match="tree=N"):
        speculative_sample(target, iid, PROMPT, 3, temperature=1.0, verification="spectr")
    with pytest.raises(ValueError, match="typical"):
        speculative_sample(target, iid, PROMPT, 3, tree=4, temperature=1.0, acceptance="typical", verification="spectr")
    with pytest.raises(ValueError, match="tree=N"):
        speculative_sample(target, iid, PROMPT, 3, temperature=1.0, verification="traversal")
    with pytest.raises(ValueError, match="typical"):
        speculative_sample(
            target, draft, PROMPT, 3, tree=4, temperature=1.0, acceptance="typical", verification="traversal"
        )
    with pytest.raises(ValueError, match="'traversal'"):
        speculative_sample(target, draft, PROMPT, 3, tree=4, temperature=1.0, verification="sideways")
    with pytest.raises(ValueError, match="siblings"):
        ModelDrafter(draft, siblings="distinct")
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="i.i.d."):  # a tree whose siblings report different rows
        spectr_tree([0, 1], [-1, -1], np.array([[0.5, 0.5], [0, 1]], np.float32), np.full((3, 2), 0.5, np.float32), rng)
    out = speculative_sample(target, iid, PROMPT, 6, K=2, tree=4, temperature=1.0, seed=0, verification="spectr")
    assert len(out.tokens) == 6 and out.drafted > 0


@pytest.mark.slow  # ~3 min on a 2-core machine: 4 x 200 runs of SmolLM2-135M on a 2-token prompt
def test_the_tree_rules_reproduce_smollm2_with_top_k(smollm2_gguf, monkeypatch):
    """SmolLM2-135M drafting for itself by early exit (i.i.d. siblings, which SpecTr needs), top_k = 4, T = 1:
    the law of 2-token continuations (16 of them: one round, a 1-deep tree of 3 siblings and its bonus token)
    for SpecInfer, SpecTr and traversal against the target's own filtered law; SpecTr with gamma = 1 fails.
    The exit is at layer 29 of 30: shallower exits' top-4 share no token with the target's here (beta = 0),
    and then every rule, broken or not, just draws from p."""
    target = load_model(str(smollm2_gguf))
    prompt = target.tokenizer.encode("The cat")
    params = SamplingParams(1.0, top_k=4)
    exact = filtered_continuations(target, prompt, 2, params)
    drafter = EarlyExitDrafter(target, n_layer=29, tree_width=3, siblings="iid")

    def sampler(rule):
        def run(rng):
            return speculative_sample(
                target, drafter, prompt, 2, K=1, temperature=1.0, top_k=4, rng=rng, tree=3, verification=rule
            )

        return run

    for seed, rule in enumerate(["token", "spectr", "traversal"]):
        ok, stat, df = chi_square_passes(sample_many(sampler(rule), n_samples=200, seed=seed), exact)
        assert ok, f"{rule}: chi2={stat:.1f} df={df}"
    monkeypatch.setattr(verify.spectr, "spectr_plan", broken_spectr_plan)
    ok, stat, df = chi_square_passes(sample_many(sampler("spectr"), n_samples=200, seed=3), exact)
    print(f"broken SpecTr on SmolLM2: chi2={stat:.1f} df={df}")
    assert not ok, f"the broken SpecTr passed (chi2={stat:.1f}, df={df})"
