"""The speed-ups' own correctness: each fast path gives the numbers the plain one does."""

from __future__ import annotations

import numpy as np
import pytest

from specdec import gpt2


@pytest.mark.parametrize("shape", [(1, 1), (15, 7), (16, 3), (17, 40), (48, 1000), (100, 33)])
def test_transposed_copy_is_an_exact_contiguous_transpose(shape):
    """Band edges: fewer rows than one band, exactly one band, one row over, many bands."""
    w = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    w_t = gpt2.transposed_copy(w)
    assert w_t.flags.c_contiguous and w_t.dtype == np.float32 and w_t.shape == shape[::-1]
    assert np.array_equal(w_t, w.T)
    assert not np.shares_memory(w_t, w)


def test_transposed_copy_reads_a_memory_map(tmp_path):
    """What the loader hands it: a read-only np.memmap view into a file."""
    w = np.random.default_rng(1).standard_normal((37, 21), dtype=np.float32)
    w.tofile(tmp_path / "w.bin")
    mapped = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="r", shape=w.shape)
    assert np.array_equal(gpt2.transposed_copy(mapped), w.T)
    assert np.array_equal(gpt2.Linear.from_checkpoint(mapped, None).weight, w)
