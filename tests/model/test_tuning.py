"""Each matrix's product path: every path gives the same product, the measurement picks the fastest, the plan
file is trusted only after it is checked (specdec/model/tuning.py)."""

import json

import numpy as np
import pytest

from specdec.model import kernels, threads, tuning
from specdec.model.kernels import M_BUCKETS, PATHS, Linear
from specdec.model.llama import LlamaHParams, random_llama
from specdec.model.shapes import random_model

needs_blas = pytest.mark.skipif(threads.BLAS is None, reason="NumPy's OpenBLAS was not found: nothing is tuned")


def split_llama(monkeypatch):
    """A tiny Llama whose matrices are all split (SMALL_BYTES 0), so each has every path."""
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    monkeypatch.setattr(kernels, "SPLIT_PARTS", 2)
    h = LlamaHParams(n_vocab=96, n_ctx=64, n_embd=32, n_head=4, n_kv_head=2, n_layer=3, n_ff=48)
    return random_llama(h, seed=1)


@pytest.mark.parametrize("n_seq", [1, 2, 4, 16, 17, 40, 70])
def test_every_path_gives_the_same_product(monkeypatch, n_seq):
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    monkeypatch.setattr(kernels, "SPLIT_PARTS", 2)
    rng = np.random.default_rng(n_seq)
    w = rng.standard_normal((48, 200), dtype=np.float32)
    b = rng.standard_normal(200, dtype=np.float32)
    lin = Linear.from_checkpoint(w, b)
    x = rng.standard_normal((n_seq, 48), dtype=np.float32)
    for path in PATHS:
        y = kernels.linear(x, lin, path)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, x.astype(np.float64) @ w + b, atol=1e-4, rtol=1e-5, err_msg=path)


def test_a_plan_maps_each_pass_length_to_its_bucket():
    lin = Linear(np.ones((64, 8), np.float32), None)
    lin.plan = tuple(f"p{m}" for m in M_BUCKETS)
    assert [lin.path(n) for n in (1, 2, 4, 5, 8, 16, 17, 64, 65, 512)] == [
        "p1", "p2", "p3", "p5", "p5", "p9", "p17", "p33", "p65", "p65"]  # fmt: skip
    lin.plan = None
    assert lin.path(1) == kernels.default_path(1, len(lin.parts))


def test_linears_of_lists_every_matrix_once_in_pass_order():
    llama = random_llama()
    found = tuning.linears_of(llama.weights)
    blocks = llama.weights.blocks
    expected = [m for b in blocks for m in (b.attn_qkv, b.attn_output, b.ffn_gate_up, b.ffn_down)]
    assert found == [*expected, llama.weights.lm_head]
    gpt2 = random_model(n_layer=2, n_embd=32, n_head=4, n_vocab=50, n_ctx=32)
    assert len(tuning.linears_of(gpt2.weights)) == 4 * 2 + 1


@needs_blas
def test_measure_picks_the_fastest_path_per_bucket_and_gives_up_on_a_stalling_one(monkeypatch):
    """A fake clock: each product costs what `cost` says, so the fastest path is known per bucket."""
    model = split_llama(monkeypatch)
    monkeypatch.setattr(threads, "BLAS_THREADS", 2)
    now = [0.0]
    calls = {p: 0 for p in PATHS}

    def cost(path, m):  # workers fastest for few tokens, one thread in between, OpenBLAS's threads stall
        return {"workers": 1.0 if m <= 3 else 2.0, "one": 2.0 if m <= 3 else 1.0, "blas": 1000.0}[path]

    def fake_linear(x, lin, path=None):
        calls[path] += 1
        now[0] += cost(path, x.shape[0])

    monkeypatch.setattr(kernels, "linear", fake_linear)
    linears = tuning.linears_of(model.weights)
    plan = tuning.measure(linears, repeats=3, clock=lambda: now[0])
    expected = ["workers" if m <= 3 else "one" for m in M_BUCKETS]
    assert plan == {tuning.shape_key(lin): expected for lin in linears}
    # Each bucket's first sweep is the split's (PATHS order), so every blas sweep stops after one product.
    n_buckets, n_linears = len(M_BUCKETS), len(linears)
    assert calls["blas"] == n_buckets * 3
    assert calls["workers"] == calls["one"] == n_buckets * 3 * n_linears


@needs_blas
def test_the_plan_file_is_written_then_trusted_only_after_its_checks(monkeypatch, tmp_path):
    model = split_llama(monkeypatch)
    measured = []
    fake = {k: ["one"] * len(M_BUCKETS) for k in {tuning.shape_key(lin) for lin in tuning.linears_of(model.weights)}}

    def fake_measure(linears, repeats=tuning.REPEATS, clock=None):
        measured.append(len(linears))
        return {k: list(v) for k, v in fake.items()}

    monkeypatch.setattr(tuning, "measure", fake_measure)
    monkeypatch.delenv(tuning.ENV, raising=False)
    assert tuning.tune(model, tmp_path) == fake and len(measured) == 1
    path = tuning.plan_file(tmp_path)
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file left"
    assert all(lin.plan == ("one",) * len(M_BUCKETS) for lin in tuning.linears_of(model.weights))

    tuning.tune(split_llama(monkeypatch), tmp_path)
    assert len(measured) == 1, "a valid plan file is read, not measured again"

    good = json.loads(path.read_text())
    broken = {
        "not JSON": "{",
        "an unknown path": {**good, "plans": {k: ["fast"] * len(M_BUCKETS) for k in fake}},
        "a plan too short": {**good, "plans": {k: ["one"] for k in fake}},
        "other buckets": {**good, "buckets": [1, 2]},
        "another machine": {**good, "machine": {**good["machine"], "cpu": "another CPU"}},
        "another format": {**good, "format": "something else"},
    }
    for why, data in broken.items():
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        before = len(measured)
        tuning.tune(split_llama(monkeypatch), tmp_path)
        assert len(measured) == before + 1, f"a plan file with {why} must be measured again"
        assert tuning.read_plan(path) == fake, f"and rewritten whole ({why})"

    monkeypatch.setenv(tuning.ENV, "measure")
    tuning.tune(split_llama(monkeypatch), tmp_path)
    assert len(measured) == len(broken) + 2, "SPECDEC_KERNELS=measure measures again"
    monkeypatch.setenv(tuning.ENV, "rules")
    fresh = split_llama(monkeypatch)
    assert tuning.tune(fresh, tmp_path) == {} and all(lin.plan is None for lin in tuning.linears_of(fresh.weights))
    monkeypatch.setenv(tuning.ENV, "fastest")
    with pytest.raises(ValueError, match="SPECDEC_KERNELS must be 'rules'.*or unset; not 'fastest'"):
        tuning.tune(fresh, tmp_path)


def test_unsplit_matrices_keep_the_default_rules(tmp_path):
    """A toy's matrices are below SMALL_BYTES: nothing to measure, no file written."""
    model = random_llama()
    assert tuning.tune(model, tmp_path) == {}
    assert list(tmp_path.iterdir()) == []
    assert all(lin.plan is None for lin in tuning.linears_of(model.weights))


@needs_blas
def test_a_tuned_model_gives_the_logits_of_an_untuned_one(monkeypatch, tmp_path):
    """A real (short) measurement on a split toy, then any plan: logits as with the default rules."""
    monkeypatch.setattr(tuning, "REPEATS", 1)
    model = split_llama(monkeypatch)
    tokens = list(range(1, 40))
    reference = model.forward(tokens, model.new_cache())
    tuning.tune(model, tmp_path)
    np.testing.assert_allclose(model.forward(tokens, model.new_cache()), reference, atol=1e-5)
    for path in PATHS:  # each path everywhere, for a pass of each length
        for lin in tuning.linears_of(model.weights):
            lin.plan = (path,) * len(M_BUCKETS)
        cache = model.new_cache()
        logits = np.concatenate([model.forward(tokens[:20], cache), model.forward(tokens[20:25], cache),
                                 model.forward(tokens[25:], cache)])  # fmt: skip
        np.testing.assert_allclose(logits, reference, atol=1e-5, err_msg=path)
