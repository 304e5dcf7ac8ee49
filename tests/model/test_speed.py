"""The speed-ups' own correctness: each fast path gives the numbers the plain one does."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import near_tie_model

from specdec.model.linear import Linear
from specdec.model.fast import kernels
from specdec.model.gpt2 import GPT2, HParams, random_weights


@pytest.mark.parametrize("shape", [(1, 1), (15, 7), (16, 3), (17, 40), (48, 1000), (100, 33)])
def test_transposed_copy_is_an_exact_contiguous_transpose(shape):
    """Band edges: fewer rows than one band, exactly one band, one row over, many bands."""
    w = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    w_t = kernels.transposed_copy(w)
    assert w_t.flags.c_contiguous and w_t.dtype == np.float32 and w_t.shape == shape[::-1]
    assert np.array_equal(w_t, w.T)
    assert not np.shares_memory(w_t, w)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_transposed_copy_split_over_threads_covers_every_band(monkeypatch, parts):
    """Each worker copies its own bands of W's rows; together, every row exactly once."""
    monkeypatch.setattr(kernels, "SPLIT_PARTS", parts)
    w = np.random.default_rng(2).standard_normal((16 * 7 + 5, 300), dtype=np.float32)
    assert np.array_equal(kernels.transposed_copy(w), w.T)


@pytest.mark.parametrize("where", [0, 1_500_000, 3_000_000 - 1])
def test_the_load_time_nan_scan_finds_a_bad_value_in_any_worker_s_share(monkeypatch, where):
    from specdec.checkpoints.safetensors import check_finite
    from specdec.checkpoints.safetensors import CheckpointError

    monkeypatch.setattr(kernels, "SPLIT_PARTS", 3)  # one chunk per worker, whatever this machine has

    w = np.zeros(3_000_000, np.float32)  # three scan chunks of 2**20, shared between the workers
    check_finite(w, "w", "test")
    w[where] = np.inf if where else np.nan
    with pytest.raises(CheckpointError, match="'w' holds NaN or infinite values"):
        check_finite(w, "w", "test")


def test_transposed_copy_reads_a_memory_map(tmp_path):
    """What the loader hands it: a read-only np.memmap view into a file."""
    w = np.random.default_rng(1).standard_normal((37, 21), dtype=np.float32)
    w.tofile(tmp_path / "w.bin")
    mapped = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="r", shape=w.shape)
    assert np.array_equal(kernels.transposed_copy(mapped), w.T)
    assert np.array_equal(Linear.from_checkpoint(mapped, None).weight, w)


# --- the row split over specdec's own threads ----------------------------------------------


@pytest.mark.parametrize("small_gemm", [False, True])
@pytest.mark.parametrize("n_parts", [1, 2, 3])
@pytest.mark.parametrize("n_in, n_out", [(48, 1000), (100, 37), (7, 300)])
def test_split_linear_matches_plain_matmul(monkeypatch, n_parts, n_in, n_out, small_gemm):
    """Every path of linear(): 1 token, 2..16 (stacked chunks or small GEMMs), 17+ (plain), any number of parts."""
    monkeypatch.setattr(kernels, "SPLIT_PARTS", n_parts)
    monkeypatch.setattr(kernels, "SMALL_GEMM", small_gemm)
    monkeypatch.setattr(kernels, "SPLIT_ONE_TOKEN", not small_gemm)  # both 1-token paths too
    monkeypatch.setattr(kernels, "SMALL_GEMM_MNK", 16 * 50 * 4)  # 16-row blocks up to 4 tokens, leftover rows
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    monkeypatch.setattr(kernels, "CHUNK_BYTES", 2048)  # several chunks and leftover rows per part
    rng = np.random.default_rng(n_parts)
    w = rng.standard_normal((n_in, n_out), dtype=np.float32)
    b = rng.standard_normal(n_out, dtype=np.float32)
    lin = Linear.from_checkpoint(w, b)
    assert len(kernels.split(lin).parts) == min(n_parts, n_out // 16)
    assert [p.start for p in kernels.split(lin).parts[1:]] == [
        p.stop for p in kernels.split(lin).parts[:-1]
    ] and kernels.split(lin).parts[-1].stop == n_out
    for n_seq in range(1, 20):
        x = rng.standard_normal((n_seq, n_in), dtype=np.float32)
        y = kernels.linear(x, lin)
        assert y.dtype == np.float32 and y.shape == (n_seq, n_out)
        np.testing.assert_allclose(y, x.astype(np.float64) @ w + b, atol=1e-4, rtol=1e-5)


def test_openblas_is_single_threaded_only_inside_a_split_product(monkeypatch):
    from specdec.model.fast import threads

    if threads.BLAS is None:
        pytest.skip("NumPy's OpenBLAS was not found: linear() does not split")
    monkeypatch.setattr(kernels, "SPLIT_PARTS", 2)
    monkeypatch.setattr(kernels, "SMALL_BYTES", 1 << 16)
    seen = []
    lin = Linear.from_checkpoint(np.ones((64, 512), np.float32), None)  # 128 kB, over 64 kB: split in 2
    assert len(kernels.split(lin).parts) == 2
    original = kernels.part_product

    def spy(x, part, out):
        seen.append(threads.BLAS.get())
        original(x, part, out)

    monkeypatch.setattr(kernels, "part_product", spy)
    before = threads.BLAS.get()
    threads.BLAS.set(2)
    try:
        y = kernels.linear(np.ones((3, 64), np.float32), lin)
        assert threads.BLAS.get() == 2, "the thread count must be put back"
    finally:
        threads.BLAS.set(before)
    assert seen == [1, 1] and np.all(y == 64)


def test_an_error_in_a_worker_reaches_the_caller_and_the_pool_still_works():
    from specdec.model.fast import threads

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

    monkeypatch.setattr(kernels, "SPLIT_PARTS", 2)
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 2000), dtype=np.float32)
    lin = Linear.from_checkpoint(w, None)
    xs = [rng.standard_normal((1 + i % 5, 64), dtype=np.float32) for i in range(8)]
    expected = [x @ w for x in xs]
    errors = []

    def work(i):
        for _ in range(20):
            if not np.allclose(kernels.linear(xs[i], lin), expected[i], atol=1e-3):
                errors.append(i)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert errors == []


# --- exact greedy: the float64 option ---------------------------------------------------------


def test_float64_target_removes_the_float32_near_tie_caveat():
    """In float32 the near-ties make greedy speculative differ from greedy autoregressive
    (the caveat the README states); with the target in float64 they agree, every time."""
    from specdec.autoregressive import autoregressive_sample
    from specdec.speculative import speculative_sample

    draft = near_tie_model()
    target64 = draft.astype(np.float64)
    prompts = [list(np.random.default_rng(seed).integers(0, 300, size=3)) for seed in range(4)]
    differ32 = agree64 = 0
    for prompt in prompts:
        ar32 = autoregressive_sample(draft, prompt, 40).tokens
        ar64 = autoregressive_sample(target64, prompt, 40).tokens
        assert {10, 11} <= set(ar64), "both near-tied tokens must be chosen somewhere, or nothing is tested"
        logits = target64(prompt + ar64[:-1])[len(prompt) - 1 :]  # the rows that chose ar64
        assert np.all(np.abs(logits[:, 10] - logits[:, 11]) < 1e-4), "every step must be a near-tie"
        for K in (1, 3, 5):
            differ32 += speculative_sample(draft, draft, prompt, 40, K=K).tokens != ar32
            agree64 += speculative_sample(target64, draft, prompt, 40, K=K).tokens == ar64
    assert differ32 > 0, "float32 should show the caveat on these near-ties"
    assert agree64 == 3 * len(prompts)


def test_astype_float64():
    model = near_tie_model()
    model64 = model.astype(np.float64)
    cache = model64.new_cache()
    logits = model64.forward(np.array([1, 2, 3]), cache)
    assert model64.dtype == np.float64 and logits.dtype == np.float64 and cache.k.dtype == np.float64
    assert all(lin.w_t.dtype == np.float64 for b in model64.weights.blocks for lin in (b.attn_c_attn, b.mlp_c_proj))
    np.testing.assert_allclose(logits, model(np.array([1, 2, 3])), rtol=1e-5, atol=1e-4)
    assert model.dtype == np.float32 and model(np.array([1])).dtype == np.float32, "the original is untouched"
    back = model64.astype(np.float32)
    assert np.array_equal(back.weights.blocks[1].mlp_c_fc.w_t, model.weights.blocks[1].mlp_c_fc.w_t)
    with pytest.raises(ValueError, match="float32 or float64"):
        model.astype(np.float16)


# --- the restricted-vocabulary draft head ----------------------------------------------------


def test_restricted_head_logits_are_the_full_ones_on_its_tokens_and_minus_inf_elsewhere():
    from conftest import tiny_model

    from specdec.drafters.restricted import restrict

    model = tiny_model(seed=4)
    draft = restrict(model, 50)
    ids = draft.vocab.ids
    assert len(ids) == 50 and ids[-1] == model.n_vocab - 1 and np.all(ids[:-1] == np.arange(49))
    tokens = np.array([3, 70, 200, 5])  # inputs outside the draft vocabulary are fine: wte is whole
    full, cut = model(tokens), draft(tokens)
    assert cut.shape == full.shape and cut.dtype == np.float32
    np.testing.assert_allclose(cut[:, ids], full[:, ids], rtol=1e-5, atol=1e-5)
    outside = np.setdiff1d(np.arange(model.n_vocab), ids)
    assert np.all(cut[:, outside] == -np.inf)
    logits, hidden = draft.forward(tokens, draft.new_cache(), return_hidden=True)
    assert np.array_equal(logits[:, outside], cut[:, outside]) and hidden.shape == (4, model.n_embd)
    assert draft.weights.blocks is model.weights.blocks, "everything but the head is shared"

    corpus = [7, 7, 7, 9, 9, 2]
    assert list(restrict(model, 2, corpus_ids=corpus).vocab.ids) == [7, 9]
    for bad in (0, model.n_vocab + 1):
        with pytest.raises(ValueError, match="restricted head needs"):
            restrict(model, bad)


@pytest.mark.slow
def test_restricted_draft_keeps_greedy_and_sampled_output_exact(monkeypatch):
    """Greedy: token for token. Sampling: the target's exact distribution (chi-square), and a
    broken verification rule fails the same check."""
    from conftest import tiny_model
    from helpers import chi_square_passes, exact_continuations, sample_many, verify_resample_target_on_reject

    import specdec.verify as verify
    from specdec import autoregressive_sample, speculative_sample
    from specdec.drafters.restricted import restrict
    from specdec.sampling import SamplingParams

    target = tiny_model(seed=1)
    draft = restrict(tiny_model(seed=1), 120)  # the target's own weights, minus most of its head
    for prompt in ([1], [5, 6, 7], [200, 3, 200, 3]):
        for K in (1, 3, 6):
            assert (
                speculative_sample(target, draft, prompt, 25, K=K).tokens
                == autoregressive_sample(target, prompt, 25).tokens
            )

    hp = HParams(n_vocab=12, n_ctx=16, n_embd=16, n_head=2, n_layer=2)
    small = GPT2(hp, random_weights(hp, seed=11, scale=0.6))
    small_draft = restrict(small, 5)  # tokens 0..3 and 11: more than half the vocabulary never drafted
    prompt = [1, 2, 1]
    exact = exact_continuations(small, prompt, 2, SamplingParams(1.0))

    def run(rng):
        return speculative_sample(small, small_draft, prompt, 2, K=2, temperature=1.0, rng=rng)

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=6000), exact)
    assert ok, f"chi2={stat:.1f} df={df}"
    monkeypatch.setattr(verify, "sampled_chain", verify_resample_target_on_reject)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=2000), exact)
    assert not ok, f"a broken sampler passed with a restricted draft (chi2={stat:.1f})"


# --- the benchmark's sections for all of the above ------------------------------------------


def test_bench_sections_kernel_restricted_exact(tmp_path):
    """Structure and sanity only (a benchmark is a script, not a timed test)."""
    import json
    import math

    import specdec.bench.speed as bench

    path = tmp_path / "bench.json"
    bench.main(["--quick", "--sizes", "tiny,tiny2", "--only", "kernel,restricted,exact", "--json", str(path)])
    r = json.loads(path.read_text())

    def positive(x):
        return isinstance(x, (int, float)) and math.isfinite(x) and x > 0

    for size in ("tiny", "tiny2"):
        kernel = r["kernel"][size]
        assert set(kernel) == {"attn_c_attn", "attn_c_proj", "mlp_c_fc", "mlp_c_proj", "lm_head"}
        assert kernel["mlp_c_fc"]["weight_shape"] == [bench.ALL_SIZES[size].n_embd, 4 * bench.ALL_SIZES[size].n_embd]
        for res in kernel.values():
            assert res["m"] == list(range(1, 17)) and res["r"][0] == 1.0 and all(positive(x) for x in res["r"])
        exact = r["exact"][size]
        assert exact["float32"]["step_ms"] > 0 and exact["float64"]["step_ms"] > 0
        assert all(positive(exact[k]["r5"]) for k in ("float32", "float64"))
    c = r["restricted"]["c"]["tiny2"]
    assert set(c) == {"tiny", "tiny, N=128", "tiny, N=256"} and all(positive(x) for x in c.values())
    assert r["restricted"]["step_ms"]["tiny2"] > 0


@pytest.mark.parametrize("preset", [None, "28"])
def test_importing_specdec_first_makes_openblas_threads_sleep_at_once_unless_the_user_chose(preset):
    """specdec sets OPENBLAS_THREAD_TIMEOUT before NumPy loads OpenBLAS (which reads it once), so
    OpenBLAS's idle threads stop spinning on the core specdec's workers need; a value the user set stays."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if preset is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = preset
    # An import hook notes the variable at the moment NumPy's import begins, which is when OpenBLAS reads it.
    probe = """
import os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not seen:
            seen.append(os.environ.get("OPENBLAS_THREAD_TIMEOUT", "unset"))
sys.meta_path.insert(0, Spy())
import specdec
print(seen[0], os.environ["OPENBLAS_THREAD_TIMEOUT"])
"""
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [preset or "4"] * 2
    # And NumPy first (as `%matplotlib inline` does in a notebook): too late for OpenBLAS (docs/performance.md).
    late = probe.replace("import specdec", "import numpy, specdec")
    out = subprocess.run([sys.executable, "-c", late], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [preset or "unset", preset or "4"]
