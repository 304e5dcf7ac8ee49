"""Drafters and their interface: n-gram lookup, early exit on the shared cache,
Proposal shapes, custom drafters, and the vocabulary check."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model
from helpers import SMALL

from specdec import Proposal, autoregressive_sample, speculative_sample
from specdec.drafters import EarlyExitDrafter, NgramDrafter, make_drafter
from specdec.model.gpt2 import GPT2, random_weights
from specdec.sampling import SamplingParams


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1)


def test_ngram_lookup():
    d = NgramDrafter(n_vocab=50, n_max=3)
    assert d.lookup([1, 2, 3, 9, 1, 2, 3], 4) == [9, 1, 2, 3]
    assert d.lookup([5, 2, 3, 7, 1, 2, 3], 2) == [7, 1]  # the 3-gram [1,2,3] has no earlier match; [2,3] does
    assert d.lookup([4, 1, 8, 1, 8, 1], 3) == [8, 1, 8]  # [1,8,1] last seen at 1; the copy runs into itself
    assert d.lookup([7, 7, 7, 7], 5) == [7, 7, 7, 7, 7]
    assert d.lookup([6, 1, 2, 9, 1, 2], 5) == [9, 1, 2, 9, 1]
    assert d.lookup([1, 2, 3], 4) == []
    assert d.lookup([7], 4) == []
    assert NgramDrafter(50, n_max=1).lookup([5, 3, 5, 4, 5], 2) == [4, 5]  # most recent 1-gram match


def test_ngram_proposals_are_point_masses():
    d = NgramDrafter(n_vocab=10)
    sampled = d.propose([1, 2, 3, 1, 2], 2, SamplingParams(1.0), np.random.default_rng(0))
    assert sampled.tokens == [3, 1] and sampled.is_chain
    np.testing.assert_array_equal(sampled.q, np.eye(10, dtype=np.float32)[[3, 1]])
    assert d.propose([1, 2, 3, 1, 2], 2, SamplingParams(0.0), None).q is None  # greedy never reads q


def test_early_exit_drafter_restores_the_shared_cache(target):
    drafter = EarlyExitDrafter(target, n_layer=1)
    cache = target.new_cache()
    drafter.begin(target, cache, [1, 2, 3, 4])
    target.forward([1, 2, 3], cache)
    proposal = drafter.propose([1, 2, 3, 4], 3, SamplingParams(1.0), np.random.default_rng(0))
    assert len(proposal.tokens) == 3 and proposal.q.shape == (3, target.n_vocab) and drafter.calls == 3
    assert proposal.parents == [-1, 0, 1] and cache.length == 3
    with pytest.raises(ValueError, match="different target"):
        drafter.begin(tiny_model(seed=5), cache, [1, 2])


def test_proposal_chain_and_tree_shapes():
    chain = Proposal.chain([5, 6, 7], np.full((3, 10), 0.1, np.float32))
    assert chain.parents == [-1, 0, 1] and chain.is_chain and len(chain) == 3
    assert chain.pass_parents() is None  # the verification pass's causal default
    assert Proposal.chain([]).is_chain and Proposal.chain([]).q is None
    tree = Proposal([5, 6, 7], [-1, -1, 0])  # two children of the text's last token; 7 follows 5
    assert not tree.is_chain and tree.pass_parents() == [-1, 0, 0, 1]
    with pytest.raises(AssertionError, match="parents must come first"):
        Proposal([5, 6], [1, -1])
    with pytest.raises(AssertionError, match="rows"):
        Proposal.chain([5, 6], np.zeros((3, 10), np.float32))


def test_drafter_specs(target):
    assert isinstance(make_drafter("ngram", target), NgramDrafter) and make_drafter("ngram", target).n_max == 3
    assert make_drafter("ngram:5", target).n_max == 5
    assert make_drafter("early_exit:1", target).n_layer == 1
    for bad, message in [
        ("ngram:abc", "ngram:N"),
        ("ngram:0", "ngram:N"),
        ("early_exit:x", "early_exit:L"),
        ("early_exit:2", "early exit"),
        ("bogus", "unknown drafter"),
    ]:
        with pytest.raises(ValueError, match=message):
            make_drafter(bad, target)


def test_vocabulary_mismatch_is_refused(target):
    other = GPT2(SMALL, random_weights(SMALL))
    with pytest.raises(ValueError, match="share a vocabulary"):
        speculative_sample(target, other, [1, 2], 5)


def test_custom_drafters_need_the_whole_interface(target):
    class OnlyPropose:
        def begin(self, target, cache, prompt):
            pass

        def propose(self, ids, k, params, rng, nodes=None):
            return Proposal.chain([])

        def commit(self, ids, features):
            pass

    with pytest.raises(TypeError, match="begin, propose, commit, n_vocab, n_ctx"):
        speculative_sample(target, OnlyPropose(), [1, 2], 4)
    custom = OnlyPropose()
    custom.n_vocab, custom.n_ctx, custom.calls = target.n_vocab, None, 0
    out = speculative_sample(target, custom, [1, 2], 4)  # proposes nothing: plain target steps
    assert out.tokens == autoregressive_sample(target, [1, 2], 4).tokens and out.drafted == 0


def test_the_interface_docstring_example_runs(target):
    """The example drafter in interfaces.Drafter's docstring, as written there."""
    from specdec.interfaces import Drafter
    from specdec.sampling import point_mass

    class Next:
        n_vocab, n_ctx, calls = target.n_vocab, None, 0

        def begin(self, target, cache, prompt):
            pass

        def propose(self, ids, k, params, rng, nodes=None):
            tokens = [(ids[-1] + 1 + i) % self.n_vocab for i in range(k)]
            q = None if params.greedy else np.stack([point_mass(t, self.n_vocab) for t in tokens])
            return Proposal.chain(tokens, q)

        def commit(self, ids, features):
            pass

    assert isinstance(Next(), Drafter)
    for temperature in (0.0, 1.0):
        out = speculative_sample(target, Next(), [1, 2], 20, K=3, temperature=temperature, seed=0)
        ref = autoregressive_sample(target, [1, 2], 20, temperature=temperature, seed=0)
        assert len(out.tokens) == 20 and out.drafted > 0
        if temperature == 0:
            assert out.tokens == ref.tokens
