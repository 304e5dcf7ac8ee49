"""Growing draft trees (specdec/drafters/trees.py) and the tree cost model (specdec/costmodel/trees.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import chi_square_passes
from test_tree_rules import N_BROKEN, N_SAMPLES, T1, World

from specdec.costmodel import TreeAcceptance, TreePolicy, expected_tokens_per_round
from specdec.drafters import NgramDrafter
from specdec.drafters.trees import dynamic_tree, ngram_tree
from specdec.model.attention import tree_mask
from specdec.sampling import SamplingParams
from specdec.verify import sampled_tree

# --- the n-gram trie ----------------------------------------------------------------------


def test_ngram_tree_merges_every_occurrence_by_count():
    text = [5, 1, 2, 6, 1, 2, 7, 1, 2, 6, 3, 1, 2]  # the tail [1, 2] followed by 6, 7, 6
    tokens, parents = ngram_tree(text, depth=2, nodes=4)
    assert (tokens, parents) == ([6, 7, 3, 1], [-1, -1, 0, 1])  # 6 twice first; then 7; 6's newest child first
    assert ngram_tree(text, depth=2, nodes=1) == ([6], [-1])
    assert ngram_tree(text, depth=1, nodes=9) == ([6, 7], [-1, -1])
    assert ngram_tree([1, 2, 3], depth=3, nodes=5) == ([], [])  # the tail never occurred before
    tree_mask(ngram_tree(text, depth=3, nodes=9)[1])  # a valid tree, parents first


def test_ngram_tree_prefers_the_longest_tail_that_occurs():
    text = [9, 4, 2, 8, 3, 2, 7, 4, 2]  # [4, 2] occurred once (then 8); [2] twice (8, 7)
    assert ngram_tree(text, depth=1, nodes=5)[0] == [8]
    assert ngram_tree(text, depth=1, nodes=5, n_max=1)[0] == [7, 8]  # a tie: the more recent first


def occurrences(text, n_max=3):
    """Start of every earlier occurrence of the longest tail (up to n_max) that occurred, by brute force."""
    for n in range(min(n_max, len(text) - 1), 0, -1):
        found = [i for i in range(len(text) - n) if text[i : i + n] == text[-n:]]
        if found:
            return found
    return []


def test_ngram_tree_of_one_occurrence_is_the_chain_lookup():
    rng = np.random.default_rng(0)
    drafter, single = NgramDrafter(20), 0
    for _ in range(300):
        text = rng.integers(0, 8, size=int(rng.integers(2, 30))).tolist()
        tokens, parents = ngram_tree(text, depth=4, nodes=4)
        if len(occurrences(text)) == 1:
            single += 1
            assert tokens == drafter.lookup(text, 4) and parents == [-1, 0, 1, 2]
        else:
            assert len(tokens) == min(4, 4 * len(occurrences(text)))  # several paths: the budget is filled
    assert single > 20


def test_ngram_tree_copies_loops_on():
    tokens, parents = ngram_tree([7, 1, 2, 1, 2], depth=5, nodes=5)
    assert tokens == [1, 2, 1, 2, 1] and parents == [-1, 0, 1, 2, 3]


# --- the dynamic tree ----------------------------------------------------------------------


def world_step(world: World, prefix: list[int], calls: list):
    """A draft step over the synthetic world: row 0 after the prefix, row i + 1 after node i."""

    def step(tokens, parents):
        calls.append(len(tokens))
        paths = []
        for t, p in zip(tokens, parents):
            paths.append((paths[p] if p >= 0 else []) + [t])
        return np.stack([world.logits(prefix + path, "q") for path in [[], *paths]])

    return step


@pytest.mark.parametrize("width,nodes,depth", [(1, 4, 4), (2, 5, 3), (3, 12, 3), (2, 16, 8)])
def test_dynamic_tree_greedy_shape(width, nodes, depth):
    world, calls = World(T1), []
    tokens, parents, q = dynamic_tree(world_step(world, [], calls), depth, nodes, width, SamplingParams(0.0), None)
    assert q is None and len(tokens) == min(
        nodes, sum(width ** (d + 1) if d == 0 else width * width for d in range(depth))
    )
    depths = tree_mask(parents).sum(axis=1)
    assert depths.max() <= depth
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(tokens[i])
    for p, kids in children.items():
        assert len(kids) == len(set(kids)) <= width  # distinct siblings
        row = world.logits([] if p < 0 else path_tokens(tokens, parents, p), "q")
        assert kids == list(np.argsort(-row, kind="stable")[: len(kids)])  # the most likely first
    assert len(calls) == depths.max()  # one draft pass per layer
    if width == 1:
        assert parents == list(range(-1, nodes - 1))


def path_tokens(tokens, parents, i):
    path = [i]
    while parents[path[0]] >= 0:
        path.insert(0, parents[path[0]])
    return [tokens[j] for j in path]


def sample_dynamic(world: World, rng, nodes=5, width=2, depth=3, rerank=False, n=3) -> tuple:
    out: list[int] = []
    while len(out) < n:
        step = world_step(world, out, [])
        if rerank:  # BROKEN: over-draft, then keep the most confident nodes (EAGLE-2's reranking)
            tokens, parents, q = rerank_by_confidence(world, out, step, 2 * nodes, nodes, width, depth, rng)
        else:
            tokens, parents, q = dynamic_tree(step, depth, nodes, width, world.params, rng)
        p = np.stack(
            [world.row(out, "p")] + [world.row(out + path_tokens(tokens, parents, i), "p") for i in range(len(tokens))]
        )
        path, last = sampled_tree(tokens, parents, q, p, rng)
        out += [tokens[i] for i in path] + [last]
    return tuple(out[:n])


def rerank_by_confidence(world, prefix, step, over, nodes, width, depth, rng):
    tokens, parents, q = dynamic_tree(step, depth, over, width, world.params, rng)
    conf = [world.row(prefix + path_tokens(tokens, parents, i)[:-1], "q")[t] for i, t in enumerate(tokens)]
    for i, p in enumerate(parents):
        conf[i] *= conf[p] if p >= 0 else 1.0
    keep = sorted(sorted(range(len(tokens)), key=lambda i: -conf[i])[:nodes])  # a subtree: confidence falls with depth
    new = {old: j for j, old in enumerate(keep)}
    return [tokens[i] for i in keep], [new[parents[i]] if parents[i] >= 0 else -1 for i in keep], q[keep]


@pytest.mark.slow
def test_dynamic_tree_sampling_matches_the_target():
    world = World(T1, seed=3)
    rng = np.random.default_rng(0)
    ok, stat, df = chi_square_passes([sample_dynamic(world, rng) for _ in range(N_SAMPLES)], world.exact())
    assert ok, f"chi2={stat:.1f} df={df}"
    # Re-ranking drawn nodes by their own confidence keeps a token because of its own value: biased.
    rng = np.random.default_rng(1)
    broken = [sample_dynamic(world, rng, rerank=True) for _ in range(2 * N_BROKEN)]
    ok, stat, df = chi_square_passes(broken, world.exact())
    assert not ok, f"re-ranked sampled tree passed the check (chi2={stat:.1f}, df={df})"


# --- the tree cost model ----------------------------------------------------------------------


def test_chain_of_constant_acceptance_gives_the_chain_formula():
    acc = TreeAcceptance()
    acc.trials[:, 0], acc.hits[:, 0] = 1e9, 0.7e9  # a[d, 0] = 0.7 at every depth
    for k in (1, 3, 6):
        chain = list(range(-1, k - 1))
        assert acc.expected_tokens(chain) == pytest.approx(expected_tokens_per_round(0.7, k))
    taus, depths = acc.best_trees(4)
    assert taus[0] == 1.0 and depths[:2] == [0, 1]


def test_acceptance_is_learned_and_predicts_tau():
    """Rounds on a fixed tree with known per-(depth, rank) acceptance: the estimates and tau converge."""
    true = np.array([[0.6, 0.5, 0.3], [0.5, 0.4, 0.2], [0.4, 0.3, 0.2]])
    parents = [-1, -1, -1, 0, 0, 1, 3]  # ranks 0..2 at the root; two under node 0, one under 1; one under 3
    acc = TreeAcceptance(max_depth=3, max_rank=3, decay=1.0, prior_weight=1e-9)
    rng = np.random.default_rng(0)
    children = {p: [i for i, q in enumerate(parents) if q == p] for p in [-1, *range(len(parents))]}
    lengths = []
    for _ in range(20_000):
        path, node, depth = [], -1, 0
        while True:
            for rank, child in enumerate(children[node]):
                if rng.random() < true[depth, rank]:
                    path.append(child)
                    node, depth = child, depth + 1
                    break
            else:
                break
        acc.update(parents, path)
        lengths.append(len(path) + 1)
    seen = acc.trials > 100
    np.testing.assert_allclose(acc.rates[seen], true[seen], atol=0.03)
    assert acc.expected_tokens(parents) == pytest.approx(np.mean(lengths), abs=0.02)


def test_unseen_depths_borrow_from_the_depth_above():
    acc = TreeAcceptance(prior=0.6)
    np.testing.assert_allclose(acc.rates[:, 0], 0.6)  # nothing seen: the prior everywhere
    np.testing.assert_allclose(acc.rates[0, :3], [0.6, 0.3, 0.15])
    for _ in range(50):
        acc.update([-1], [0])  # one-node trees, always accepted
    assert acc.rates[0, 0] > 0.95 and acc.rates[5, 0] > 0.95  # deeper cells follow what depth 0 showed
    assert TreePolicy(c=0.0, r=[1.0, 1.3, 1.6, 1.8, 2.0], n_max=4, acceptance=acc).next_nodes() > 1


def test_tree_policy_follows_the_verification_cost():
    acc = TreeAcceptance()
    acc.trials[:] = 1e9
    acc.hits[:, 0], acc.hits[:, 1:] = 0.8e9, 0.3e9  # a = 0.8, 0.3, 0.3 ...
    assert TreePolicy(c=0.0, r=None, n_max=8, acceptance=acc).next_nodes() == 8  # r = 1: more nodes are free
    assert TreePolicy(c=0.0, r=lambda m: float(m), n_max=8, acceptance=acc).next_nodes() == 1  # r(m) = m
    measured = [1.0, 1.3, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6, 2.8]  # a CPU-like curve, r(1..9)
    n = TreePolicy(c=0.0, r=measured, n_max=8, acceptance=acc).next_nodes()
    assert 1 < n < 8
    # A draft that costs something shrinks the tree.
    assert TreePolicy(c=0.5, r=measured, n_max=8, acceptance=acc).next_nodes() <= n


# --- a GPT-2 as the tree's draft -------------------------------------------------------------


@pytest.mark.parametrize("n_layer", [None, 1])
def test_model_tree_children_are_the_models_top_tokens(n_layer):
    from conftest import tiny_model

    from specdec.drafters.trees import model_tree

    model = tiny_model(seed=2)
    text = [3, 14, 15, 92, 65]
    cache = model.new_cache()
    model.forward(text[:3], cache)  # the cache has seen part of the text
    (tokens, parents, q), calls = model_tree(model, cache, text[3:], 3, 9, 2, SamplingParams(0.0), None, n_layer)
    assert cache.length == len(text) and q is None and len(tokens) == 9 and calls == 3
    for node in [-1, *range(len(tokens))]:
        kids = [tokens[i] for i, p in enumerate(parents) if p == node]
        if kids:
            path = [] if node < 0 else path_tokens(tokens, parents, node)
            logits = model.forward(text + path, model.new_cache(), last_only=True, n_layer=n_layer)[0]
            assert kids == list(np.argsort(-logits, kind="stable")[: len(kids)]), node


def test_tree_policies():
    from specdec.costmodel import make_tree_policy

    assert make_tree_policy(None, None, None).next_nodes() is None
    assert make_tree_policy(6, None, None).next_nodes() == 6
    for bad in (0, -2, "big", 2.5, True):
        with pytest.raises(ValueError, match="tree must be"):
            make_tree_policy(bad, None, None)
    policy = TreePolicy(c=0.0)
    assert make_tree_policy(policy, None, None) is policy
