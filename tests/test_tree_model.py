"""Trees in the forward pass: the mask, position ids, and compaction of the accepted path."""

import numpy as np
import pytest
from conftest import tiny_model

from specdec.model.attention import tree_mask

TREE_ATOL = 1e-5  # a tree pass against one-token-at-a-time passes

# Trees as parent lists, parents first. -1: a child of the last cached position.
TREES = {
    "chain": [-1, 0, 1, 2],
    "two roots": [-1, -1, 0, 1, 0],
    "wide": [-1, 0, 0, 0, 1, 1, 3, 6],
    "deep and wide": [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 9, -1, 11],
}


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=4)


def path_to(parents, i: int) -> list[int]:
    """Node indices from the root down to node i."""
    path = [i]
    while parents[path[0]] >= 0:
        path.insert(0, parents[path[0]])
    return path


def test_tree_mask_is_ancestors_and_self():
    mask = tree_mask([-1, 0, 0, 1, 2, -1])
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],  # sees its parent, not its sibling
            [1, 1, 0, 1, 0, 0],
            [1, 0, 1, 0, 1, 0],  # not its cousin 3
            [0, 0, 0, 0, 0, 1],  # a second child of the cache sees only itself
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(tree_mask([-1, 0, 1, 2]), np.tri(4, dtype=bool))


@pytest.mark.parametrize("bad", [[0], [-1, 1], [-1, 0, 3, 1], [-2], [], [[-1]], [-1.0]])
def test_bad_parents_are_clear_errors(bad):
    with pytest.raises(ValueError, match="parent"):
        tree_mask(bad)


@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("n_past", [1, 6])
def test_tree_logits_equal_each_path_fed_one_token_at_a_time(model, name, n_past):
    parents = TREES[name]
    rng = np.random.default_rng(len(parents) + n_past)
    prefix = rng.integers(0, model.n_vocab, size=n_past)
    tokens = rng.integers(0, model.n_vocab, size=len(parents))
    cache = model.new_cache()
    model.forward(prefix, cache)
    tree_logits = model.forward(tokens, cache, parents=parents)  # [n_nodes, n_vocab]
    assert tree_logits.dtype == np.float32 and cache.length == n_past + len(parents)

    for i in range(len(parents)):
        one_by_one = model.new_cache()
        model.forward(prefix, one_by_one)
        for node in path_to(parents, i):
            logits = model.forward([tokens[node]], one_by_one)
        np.testing.assert_allclose(tree_logits[i], logits[0], atol=TREE_ATOL, rtol=0, err_msg=f"node {i}")


def test_tree_rows_differ_from_a_chain_over_the_same_tokens(model):
    """The mask must matter: as a chain, node 2 (a sibling of node 1) would see node 1."""
    tokens, cache_a, cache_b = [5, 9, 13], model.new_cache(), model.new_cache()
    tree = model.forward(tokens, cache_a, parents=[-1, 0, 0])
    chain = model.forward(tokens, cache_b)
    np.testing.assert_allclose(tree[:2], chain[:2], atol=TREE_ATOL, rtol=0)
    assert np.abs(tree[2] - chain[2]).max() > 1e-3


def test_single_token_tree_and_early_exit_take_parents(model):
    cache = model.new_cache()
    model.forward([1, 2, 3], cache)
    one = model.forward([4], cache, parents=[-1])
    assert one.shape == (1, model.n_vocab)
    early = model.forward([4, 5, 6], model.new_cache(), n_layer=1, parents=[-1, 0, 0])
    chain = model.forward([4, 5], model.new_cache(), n_layer=1)
    np.testing.assert_allclose(early[:2], chain, atol=TREE_ATOL, rtol=0)


def test_parents_must_match_the_tokens(model):
    with pytest.raises(ValueError, match="one per token"):
        model.forward([1, 2, 3], model.new_cache(), parents=[-1, 0])


@pytest.mark.parametrize("name", list(TREES))
def test_cache_after_compaction_equals_a_fresh_cache(model, name):
    """Keep every root-to-node path in turn; the cache must equal one built from that text."""
    parents = TREES[name]
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, model.n_vocab, size=5)
    tokens = rng.integers(0, model.n_vocab, size=len(parents))
    after = rng.integers(0, model.n_vocab, size=3)  # the next round's tokens
    for i in [None, *range(len(parents))]:  # None: nothing accepted
        path = [] if i is None else path_to(parents, i)
        cache = model.new_cache()
        model.forward(prefix, cache)
        model.forward(tokens, cache, parents=parents)
        cache.keep(len(prefix), path)

        text = np.concatenate([prefix, tokens[path]]).astype(int)
        fresh = model.new_cache()
        model.forward(text, fresh)
        n = fresh.length
        assert cache.length == n
        np.testing.assert_allclose(cache.k[:, :, :n], fresh.k[:, :, :n], atol=TREE_ATOL, rtol=0)
        np.testing.assert_allclose(cache.v[:, :, :n], fresh.v[:, :, :n], atol=TREE_ATOL, rtol=0)
        # And decoding goes on as if the tree had never been there.
        np.testing.assert_allclose(
            model.forward(after, cache), model(np.concatenate([text, after]))[n:], atol=TREE_ATOL, rtol=0
        )


def test_compaction_of_a_chain_prefix_copies_nothing(model):
    cache = model.new_cache()
    model.forward([1, 2, 3, 4, 5, 6], cache)
    cache.k.flags.writeable = cache.v.flags.writeable = False  # any copy would raise
    cache.keep(2, [0, 1, 2])
    assert cache.length == 5
    with pytest.raises(ValueError, match="read-only"):
        cache.keep(0, [0, 2])  # this one must move position 2 to 1
    cache.keep(2, [])
    assert cache.length == 2


def test_compaction_rejects_bad_rows(model):
    cache = model.new_cache()
    model.forward([1, 2, 3, 4], cache)
    for rows in ([1, 0], [0, 0], [0, 4], [-1, 0]):
        with pytest.raises(AssertionError):
            cache.keep(0, rows)
