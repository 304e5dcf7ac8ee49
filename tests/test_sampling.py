"""sampling.py: filters, probabilities and the random draw."""

import numpy as np
import pytest

from specdec.sampling import SamplingParams, _top_p, draw, point_mass, probabilities


def top_p_by_full_sort(p, top_p):
    """The definition, spelled out: stable-sort every row, keep the head whose mass reaches top_p."""
    out = np.zeros_like(p)
    for row, probs in enumerate(p):
        order = np.argsort(-probs, kind="stable")
        mass_before = np.cumsum(probs[order]) - probs[order]
        keep = order[mass_before < np.float32(top_p)]
        out[row, keep] = probs[keep] / probs[keep].sum()
    return out


@pytest.mark.parametrize("scale", [0.1, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("top_p", [0.01, 0.5, 0.9, 0.999])
def test_top_p_equals_the_full_sort_definition(scale, top_p):
    logits = (np.random.default_rng(0).standard_normal((3, 5000)) * scale).astype(np.float32)
    p = probabilities(logits, SamplingParams(1.0))
    np.testing.assert_array_equal(_top_p(p, top_p) > 0, top_p_by_full_sort(p, top_p) > 0)
    np.testing.assert_allclose(_top_p(p, top_p), top_p_by_full_sort(p, top_p), atol=1e-7)


def test_top_p_breaks_ties_by_token_id():
    p = np.full((1, 10), 0.1, dtype=np.float32)
    kept = np.flatnonzero(_top_p(p, 0.35)[0])
    assert list(kept) == [0, 1, 2, 3]  # mass before the 4th is 0.3 < 0.35, before the 5th 0.4
    np.testing.assert_array_equal(_top_p(p, 0.35), top_p_by_full_sort(p, 0.35))


def test_probabilities_are_float32_rows_that_sum_to_one():
    logits = np.random.default_rng(1).standard_normal((4, 300)).astype(np.float32) * 4
    for params in [
        SamplingParams(0.7),
        SamplingParams(1.0, top_k=5),
        SamplingParams(1.3, top_p=0.8),
        SamplingParams(1e-30),
        SamplingParams(1.0, top_k=3, top_p=0.5),
    ]:
        p = probabilities(logits, params)
        assert p.dtype == np.float32 and np.isfinite(p).all()
        np.testing.assert_allclose(p.sum(axis=-1), 1.0, atol=1e-5)
        if params.top_k:
            assert ((p > 0).sum(axis=-1) <= params.top_k).all()


def test_a_tiny_temperature_is_a_point_mass_on_the_argmax():
    logits = np.random.default_rng(2).standard_normal((3, 50)).astype(np.float32)
    p = probabilities(logits, SamplingParams(1e-30))
    np.testing.assert_array_equal(p.argmax(axis=-1), logits.argmax(axis=-1))
    np.testing.assert_array_equal(p.max(axis=-1), 1.0)


def test_draw_follows_the_distribution_and_never_picks_zero_probability():
    p = np.array([0.0, 0.5, 0.0, 0.2, 0.3, 0.0], dtype=np.float32)
    rng = np.random.default_rng(3)
    counts = np.bincount([draw(p, rng) for _ in range(20_000)], minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    np.testing.assert_allclose(counts / 20_000, p, atol=0.015)
    assert draw(point_mass(4, 6), rng) == 4
