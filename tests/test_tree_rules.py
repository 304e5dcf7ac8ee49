"""Tree verification rules against exact distributions, with no model at all.

A synthetic target and draft give, for every prefix over a 4-token vocabulary,
a fixed random row of logits (the draft's: the target's plus noise). Trees of
several shapes are drafted with siblings drawn i.i.d., without replacement, or
as deterministic top-k candidates; each round verifies one tree and emits its
accepted path plus one target token; rounds repeat until 3 tokens are out.
The exact probability of every 3-token output is the product of the target's
conditionals, and a chi-square test compares. Broken rules and broken drafting
run through the same check and must fail it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import chi_square_passes

from specdec.sampling import SamplingParams, draw, probabilities
from specdec.verify import (
    children_of,
    draw_iid,
    draw_without_replacement,
    greedy_tree,
    sampled_tree,
    top_k_distinct,
    typical_tree,
)

V = 4  # vocabulary
N_OUT = 3  # tokens per sample: the joint over V**N_OUT = 64 outputs
N_SAMPLES = 6_000
N_BROKEN = 2_000
T1 = SamplingParams(1.0)


class World:
    """A synthetic target p and draft q: one fixed random logit row per (prefix, model)."""

    def __init__(self, params: SamplingParams, seed: int = 0, scale: float = 1.3, noise: float = 1.0):
        self.params, self.seed, self.scale, self.noise = params, seed, scale, noise
        self._rows: dict[tuple, np.ndarray] = {}

    def logits(self, prefix, model: str) -> np.ndarray:
        rng = np.random.default_rng([self.seed, *prefix, 99])  # the same row for the same prefix, every time
        target = rng.standard_normal(V).astype(np.float32) * np.float32(self.scale)
        if model == "p":
            return target
        return target + np.float32(self.noise) * rng.standard_normal(V).astype(np.float32)

    def row(self, prefix, model: str, params: SamplingParams | None = None) -> np.ndarray:
        params = params or self.params
        key = (tuple(prefix), model, params)
        if key not in self._rows:
            self._rows[key] = probabilities(self.logits(prefix, model)[None], params)[0]
        return self._rows[key]

    def exact(self, n: int = N_OUT) -> dict[tuple, float]:
        """P(output) for every n-token output: the target's chain rule."""
        return {
            seq: float(np.prod([self.row(seq[:i], "p")[t] for i, t in enumerate(seq)], dtype=np.float64))
            for seq in itertools.product(range(V), repeat=n)
        }


def siblings(mode: str):
    return {
        "iid": draw_iid,
        "without replacement": draw_without_replacement,
        "top-k": lambda q, n, rng: top_k_distinct(q, n),
    }[mode]


def draft_tree(world: World, prefix, widths, draw_siblings, rng):
    """widths[d]: children per node at depth d. Returns tokens, parents, q rows, and each node's path."""
    tokens, parents, q, paths = [], [], [], []
    frontier = [(-1, [])]  # (node, tokens from the root to it)
    for width in widths:
        grown = []
        for node, path in frontier:
            kids, rows = draw_siblings(world.row(prefix + path, "q"), width, rng, prefix + path)
            for token, row in zip(kids, rows):
                tokens.append(token)
                parents.append(node)
                q.append(row)
                paths.append(path + [token])
                grown.append((len(tokens) - 1, paths[-1]))
        frontier = grown
    return tokens, parents, np.array(q), paths


def sample(world: World, widths, draw_siblings, verify, rng, n: int = N_OUT) -> tuple:
    out: list[int] = []
    while len(out) < n:
        tokens, parents, q, paths = draft_tree(world, out, widths, draw_siblings, rng)
        p = np.stack([world.row(out, "p")] + [world.row(out + path, "p") for path in paths])  # [n + 1, V]
        path, last = verify(tokens, parents, q, p, rng)
        out += [tokens[i] for i in path] + [last]
    return tuple(out[:n])


def check(world, widths, draw_siblings, verify=sampled_tree, n_samples=N_SAMPLES, seed=0):
    rng = np.random.default_rng(seed)
    samples = [sample(world, widths, draw_siblings, verify, rng) for _ in range(n_samples)]
    return chi_square_passes(samples, world.exact())


def honest(mode: str):
    """The correct drafting: siblings and their q rows from the helper for `mode`."""
    return lambda q, n, rng, prefix: siblings(mode)(q, n, rng)


# --- broken variants -------------------------------------------------------------------


def verify_residual_not_updated(tokens, parents, q, p, rng):
    """BROKEN: tests every sibling against p itself; forms the residual only after the last one."""
    children, path, row = children_of(parents), [], 0
    while True:
        for child in children[row]:
            if rng.random() * q[child, tokens[child]] < p[row, tokens[child]]:
                path.append(child)
                row = child + 1
                break
        else:
            r = np.maximum(p[row] - q[children[row][-1]], 0) if children[row] else p[row]
            return path, draw(r if r.sum() > 0 else p[row], rng)


def typical_lossy(tokens, parents, q, p, rng):
    return typical_tree(tokens, parents, p, rng)


def drawn_from_p(mode: str, world: World):
    """BROKEN drafting: siblings drawn from the target's row, but q rows reported as the draft's."""

    def draw_siblings(q, n, rng, prefix):
        kids, _ = siblings(mode)(world.row(prefix, "p"), n, rng)
        _, rows = siblings(mode)(q, len(kids), np.random.default_rng(0))
        return kids, rows[: len(kids)]

    return draw_siblings


def without_replacement_reporting_q(q, n, rng, prefix):
    """BROKEN drafting: distinct siblings, but every q row the original q (not renormalised)."""
    kids, _ = draw_without_replacement(q, n, rng)
    return kids, np.repeat(q[None], len(kids), axis=0)


def one_side_filtered(mode: str, world: World):
    """BROKEN drafting: siblings drawn from the filtered q, checked against the unfiltered q."""

    def draw_siblings(q, n, rng, prefix):
        kids, rows = siblings(mode)(q, n, rng)
        unfiltered = world.row(prefix, "q", SamplingParams(world.params.temperature))
        return kids, np.repeat(unfiltered[None], len(kids), axis=0) if mode == "iid" else rows

    return draw_siblings


# --- exactness --------------------------------------------------------------------------

FAST = [
    ("iid", (2, 1)),
    ("without replacement", (3, 1)),
    ("top-k", (2, 2)),
    ("iid", (1, 1, 1)),  # a chain
]
SLOW = [
    ("iid", (4,)),
    ("iid", (2, 2)),
    ("without replacement", (2, 2)),
    ("without replacement", (4,)),
    ("top-k", (3, 1)),
    ("top-k", (4,)),
    ("top-k", (1, 2)),
]


@pytest.mark.parametrize("mode,widths", FAST + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW])
def test_tree_sampling_matches_the_target(mode, widths):
    ok, stat, df = check(World(T1), widths, honest(mode))
    assert ok, f"{mode} {widths}: chi2={stat:.1f} df={df}"


FILTERS = {
    "T=0.7": SamplingParams(0.7),
    "T=1.5,top_k=3": SamplingParams(1.5, top_k=3),
    "T=1.5,top_p=0.8": SamplingParams(1.5, top_p=0.8),
}


# The default suite judges each sibling rule once and each filter once (the diagonal); -m slow every pair.
FILTERED_CASES = [
    (mode, name) if i == j else pytest.param(mode, name, marks=pytest.mark.slow)
    for i, mode in enumerate(["iid", "without replacement", "top-k"])
    for j, name in enumerate(FILTERS)
]


@pytest.mark.parametrize("mode,name", FILTERED_CASES)
def test_filtered_tree_sampling_matches_the_filtered_target(mode, name):
    world = World(FILTERS[name], seed=1)
    if FILTERS[name].top_k or FILTERS[name].top_p:
        assert min(world.exact().values()) == 0, "the filter should remove something"
    ok, stat, df = check(world, (2, 1), honest(mode), seed=1)
    assert ok, f"{mode} {name}: chi2={stat:.1f} df={df}"


# --- the same check fails broken rules and broken drafting ------------------------------


@pytest.mark.parametrize(
    "what",
    ["typical acceptance", "residual not updated", "siblings from p", "without replacement, q not renormalised"],
)
def test_broken_variants_fail_the_check(what):
    world = World(T1)
    draw_siblings, verify = honest("iid"), sampled_tree
    if what == "typical acceptance":
        verify = typical_lossy
    elif what == "residual not updated":
        verify = verify_residual_not_updated
    elif what == "siblings from p":
        draw_siblings = drawn_from_p("iid", world)
    else:
        draw_siblings = without_replacement_reporting_q
    ok, stat, df = check(world, (3, 1), draw_siblings, verify, n_samples=N_BROKEN, seed=2)
    assert not ok, f"{what} passed the check (chi2={stat:.1f}, df={df})"


@pytest.mark.parametrize("params", [SamplingParams(1.5, top_k=2), SamplingParams(1.5, top_p=0.6)])
def test_one_side_filtering_fails_the_check(params):
    world = World(params, seed=1)
    ok, stat, df = check(world, (3, 1), one_side_filtered("iid", world), n_samples=2 * N_BROKEN, seed=3)
    assert not ok, f"one-side filtering passed the check (chi2={stat:.1f}, df={df})"


# --- single-node facts --------------------------------------------------------------------


def test_first_sibling_acceptance_rate_matches_theory():
    """P(some child of the root accepted) for two i.i.d. siblings, in closed form.

    Sibling 1 is accepted with probability a1 = sum min(p, q); if not, sibling 2
    with probability a2 = sum min(r_1, q), r_1 = norm(max(0, p - q)).
    """
    world = World(T1)
    p, q = world.row([], "p"), world.row([], "q")
    a1 = float(np.minimum(p, q).sum())
    r1 = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
    a2 = float(np.minimum(r1, q).sum())
    expected = a1 + (1 - a1) * a2
    rng, n, hits = np.random.default_rng(4), 20_000, 0
    for _ in range(n):
        kids, rows = draw_iid(q, 2, rng)
        path, _ = sampled_tree(kids, [-1, -1], rows, np.stack([p, p, p]), rng)
        hits += bool(path)
    assert abs(hits / n - expected) < 4.5 * np.sqrt(expected * (1 - expected) / n), (hits / n, expected)
    assert expected > a1 + 0.02, "the second sibling should add visibly"


def test_chain_rule_is_the_tree_rule_on_a_chain():
    """On a chain, sampled_tree makes the chain rule's decisions with the same random draws."""
    from specdec.verify import sampled_chain

    world, rng = World(T1, seed=5), np.random.default_rng(6)
    for trial in range(300):
        tokens, parents, q, paths = draft_tree(world, [], (1, 1, 1), honest("iid"), rng)
        p = np.stack([world.row([], "p")] + [world.row(path, "p") for path in paths])
        seed = int(rng.integers(1 << 30))
        path, last = sampled_tree(tokens, parents, q, p, np.random.default_rng(seed))
        n_accepted, chain_last = sampled_chain(tokens, q, p, np.random.default_rng(seed))
        assert (path, last) == (list(range(n_accepted)), chain_last), trial


def test_greedy_walk():
    # Rows: 0 after the root, i + 1 after node i.
    logits = np.log(np.array([[1, 5, 2, 1], [9, 1, 1, 1], [9, 1, 1, 1], [1, 1, 9, 1], [1, 1, 1, 9]], np.float32))
    # root -> nodes 0 (token 2) and 1 (token 1); node 1 -> node 2 (token 3) and node 3 (token 0)
    tokens, parents = [2, 1, 3, 0], [-1, -1, 1, 1]
    # root: argmax 1 = node 1; row 2: argmax 0 = node 3, a leaf; row 4: the bonus, argmax 3
    assert greedy_tree(tokens, parents, logits) == ([1, 3], 3)
    assert greedy_tree([2, 3], [-1, -1], logits[:3]) == ([], 1)  # no child matches: the target's argmax
    assert greedy_tree([1, 2], [-1, 0], logits[:3]) == ([0], 0)  # a mismatch below an accepted node


def test_typical_acceptance_takes_the_longest_passing_path():
    p = np.array([[0.5, 0.5, 0, 0]] * 5, np.float32)  # entropy ln 2: threshold min(0.09, 0.15) = 0.09
    rng = np.random.default_rng(0)
    assert typical_tree([0, 1, 1, 0], [-1, -1, 1, 2], p, rng)[0] == [1, 2, 3]
    assert typical_tree([2, 3], [-1, 0], p, rng)[0] == []  # p(2) = 0 fails; its child is cut off


def test_sibling_helpers():
    q = np.array([0.1, 0.4, 0.0, 0.5], np.float32)
    tokens, rows = top_k_distinct(q, 5)
    assert tokens == [3, 1, 0] and rows.shape == (3, 4) and (rows.argmax(1) == tokens).all()
    assert top_k_distinct(np.array([1.0, 3.0, 3.0, -np.inf], np.float32), 3, floor=-np.inf)[0] == [1, 2, 0]
    rng = np.random.default_rng(0)
    for _ in range(50):
        tokens, rows = draw_without_replacement(q, 4, rng)
        assert sorted(tokens) == [0, 1, 3]  # all of q's support, each once
        for s, token in enumerate(tokens):
            expected = q.copy()
            expected[tokens[:s]] = 0
            np.testing.assert_allclose(rows[s], expected / expected.sum(), rtol=1e-6)
        assert rows.dtype == np.float32
    tokens, rows = draw_iid(q, 3, rng)
    assert len(tokens) == 3 and (rows == q).all()
