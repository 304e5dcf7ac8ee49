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


# --- the row split over specdec's own threads ----------------------------------------------


@pytest.mark.parametrize("n_parts", [1, 2, 3])
@pytest.mark.parametrize("n_in, n_out", [(48, 1000), (100, 37), (7, 300)])
def test_split_linear_matches_plain_matmul(monkeypatch, n_parts, n_in, n_out):
    """Every path of linear(): 1 token, 2..16 (stacked chunks), 17+ (plain), any number of parts."""
    monkeypatch.setattr(gpt2, "SPLIT_PARTS", n_parts)
    monkeypatch.setattr(gpt2, "SMALL_BYTES", 0)
    monkeypatch.setattr(gpt2, "CHUNK_BYTES", 2048)  # several chunks and leftover rows per part
    rng = np.random.default_rng(n_parts)
    w = rng.standard_normal((n_in, n_out), dtype=np.float32)
    b = rng.standard_normal(n_out, dtype=np.float32)
    lin = gpt2.Linear.from_checkpoint(w, b)
    assert len(lin.parts) == min(n_parts, n_out // 16)
    assert [p.start for p in lin.parts[1:]] == [p.stop for p in lin.parts[:-1]] and lin.parts[-1].stop == n_out
    for n_seq in range(1, 20):
        x = rng.standard_normal((n_seq, n_in), dtype=np.float32)
        y = gpt2.linear(x, lin)
        assert y.dtype == np.float32 and y.shape == (n_seq, n_out)
        np.testing.assert_allclose(y, x.astype(np.float64) @ w + b, atol=1e-4, rtol=1e-5)


def test_openblas_is_single_threaded_only_inside_a_split_product(monkeypatch):
    from specdec import threads

    if threads.BLAS is None:
        pytest.skip("NumPy's OpenBLAS was not found: linear() does not split")
    monkeypatch.setattr(gpt2, "SPLIT_PARTS", 2)
    seen = []
    lin = gpt2.Linear.from_checkpoint(np.ones((64, 512), np.float32), None)  # 128 kB: split in 2
    assert len(lin.parts) == 2
    original = gpt2.part_product

    def spy(x, part, out):
        seen.append(threads.BLAS.get())
        original(x, part, out)

    monkeypatch.setattr(gpt2, "part_product", spy)
    before = threads.BLAS.get()
    threads.BLAS.set(2)
    try:
        y = gpt2.linear(np.ones((3, 64), np.float32), lin)
        assert threads.BLAS.get() == 2, "the thread count must be put back"
    finally:
        threads.BLAS.set(before)
    assert seen == [1, 1] and np.all(y == 64)


def test_an_error_in_a_worker_reaches_the_caller_and_the_pool_still_works():
    from specdec import threads

    pool = threads.Workers(3, threads.BLAS)
    done = []

    def fail():
        raise ZeroDivisionError("in a worker")

    with pytest.raises(ZeroDivisionError, match="in a worker"):
        pool.run([lambda: done.append(0), fail, lambda: done.append(2)])
    assert sorted(done) == [0, 2], "every job runs even when one fails"
    pool.run([lambda: done.append(3), lambda: done.append(4)])
    assert sorted(done) == [0, 2, 3, 4]


def test_linear_from_several_threads_at_once(monkeypatch):
    """The pool is shared: a second caller while it is busy computes inline, and gets the same numbers."""
    import threading

    monkeypatch.setattr(gpt2, "SPLIT_PARTS", 2)
    monkeypatch.setattr(gpt2, "SMALL_BYTES", 0)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 2000), dtype=np.float32)
    lin = gpt2.Linear.from_checkpoint(w, None)
    xs = [rng.standard_normal((1 + i % 5, 64), dtype=np.float32) for i in range(8)]
    expected = [x @ w for x in xs]
    errors = []

    def work(i):
        for _ in range(20):
            if not np.allclose(gpt2.linear(xs[i], lin), expected[i], atol=1e-3):
                errors.append(i)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert errors == []
