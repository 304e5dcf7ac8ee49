"""Each matrix's product path: every path gives the same product, the measurement picks the fastest, the plan
file is trusted only after it is checked (specdec/model/tuning.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from specdec.model.fast import kernels, threads, tuning
from specdec.model.fast.kernels import M_BUCKETS, PATHS
from specdec.model.linear import Linear
from specdec.model.llama import LlamaHParams, random_llama
from specdec.model.shapes import random_model

needs_blas = pytest.mark.skipif(threads.BLAS is None, reason="NumPy's OpenBLAS was not found: nothing is tuned")


@pytest.fixture(autouse=True)
def no_plans_leak(monkeypatch):
    """Each test starts with no measured plans and leaves none behind (kernels.PLANS is process-wide)."""
    monkeypatch.setattr(kernels, "PLANS", {})


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
    kernels.PLANS[kernels.shape_key(lin)] = tuple(f"p{m}" for m in M_BUCKETS)
    assert [kernels.path_of(lin, n) for n in (1, 2, 4, 5, 8, 16, 17, 64, 65, 512)] == [
        "p1",
        "p2",
        "p3",
        "p5",
        "p5",
        "p9",
        "p17",
        "p33",
        "p65",
        "p65",
    ]
    del kernels.PLANS[kernels.shape_key(lin)]
    assert kernels.path_of(lin, 1) == kernels.default_path(1, len(kernels.split(lin).parts))


def test_linears_of_lists_every_matrix_once_in_pass_order():
    llama = random_llama()
    found = tuning.linears_of(llama.weights)
    blocks = llama.weights.blocks
    expected = [m for b in blocks for m in (b.attn_qkv, b.attn_output, b.ffn_gate_up, b.ffn_down)]
    assert found == [*expected, llama.weights.lm_head]
    gpt2 = random_model(n_layer=2, n_embd=32, n_head=4, n_vocab=50, n_ctx=32)
    assert len(tuning.linears_of(gpt2.weights)) == 4 * 2 + 1


@needs_blas
def test_measure_picks_openblas_s_faster_way_per_bucket_and_gives_up_on_a_stalling_one(monkeypatch):
    """A fake clock: each product costs what `cost` says, so the faster way is known per bucket."""
    model = split_llama(monkeypatch)
    now = [0.0]
    calls = {p: 0 for p in PATHS}

    def cost(path, m):  # one product per token for 2-3 tokens (one product stalls there), one product above
        return {"gemvs": 1.0 if m <= 3 else 2.0, "blas": 1000.0 if m <= 3 else 1.0}[path]

    def fake_linear(x, lin, path=None):
        calls[path] += 1
        now[0] += cost(path, x.shape[0])

    monkeypatch.setattr(kernels, "linear", fake_linear)
    linears = tuning.linears_of(model.weights)
    plan = tuning.measure(linears, repeats=3, clock=lambda: now[0])
    expected = ["gemvs" if m in (2, 3) else "blas" for m in M_BUCKETS]
    assert plan == {kernels.shape_key(lin): expected for lin in linears}
    n = len(linears)
    # Buckets 2..MAX_GEMVS (2, 3, 5, 9) are timed, 3 sweeps a way. At 2 and 3, only the first blas sweep
    # (nothing faster known yet) goes through: the other two stop after one product.
    assert calls["blas"] == 2 * (n + 2) + 2 * 3 * n
    assert calls["gemvs"] == 4 * 3 * n
    assert calls["workers"] == calls["one"] == 0


@needs_blas
def test_the_plan_file_is_written_then_trusted_only_after_its_checks(monkeypatch, tmp_path):
    model = split_llama(monkeypatch)
    measured = []
    fake = {k: ["one"] * len(M_BUCKETS) for k in {kernels.shape_key(lin) for lin in tuning.linears_of(model.weights)}}

    def fake_measure(linears, repeats=tuning.REPEATS, clock=None):
        measured.append(len(linears))
        return {k: list(v) for k, v in fake.items()}

    monkeypatch.setattr(tuning, "measure", fake_measure)
    monkeypatch.setattr(tuning, "confirm", lambda model, linears, plan: plan)
    monkeypatch.delenv(tuning.ENV, raising=False)
    assert tuning.tune(model, tmp_path) == fake and len(measured) == 1
    path = tuning.plan_file(tmp_path)
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file left"
    assert all(kernels.path_of(lin, m) == "one" for lin in tuning.linears_of(model.weights) for m in (1, 5, 100))
    head = tuning.linears_of(model.weights)[0]
    assert kernels.path_of(Linear(head.w_t.copy(), None), 1) == "one", (
        "another matrix of a planned shape follows the plan"
    )

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
        "nesting too deep for the parser": "[" * 100_000,
        "more bytes than any plan": json.dumps({**good, "padding": "x" * tuning.MAX_FILE_BYTES}),
    }
    for why, data in broken.items():
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        before = len(measured)
        tuning.tune(split_llama(monkeypatch), tmp_path)
        assert len(measured) == before + 1, f"a plan file with {why} must be measured again"
        assert tuning.read_plan(path) == fake, f"and rewritten whole ({why})"

    other = {"7x7/float32/2": ["blas"] * len(M_BUCKETS)}  # another model's shape, already in the file
    tuning.write_plan(path, {**fake, **other})
    monkeypatch.setenv(tuning.ENV, "measure")
    tuning.tune(split_llama(monkeypatch), tmp_path)
    assert len(measured) == len(broken) + 2, "SPECDEC_KERNELS=measure measures again"
    assert tuning.read_plan(path) == {**fake, **other}, "and keeps the other models' shapes"
    monkeypatch.setenv(tuning.ENV, "rules")
    kernels.PLANS.clear()
    fresh = split_llama(monkeypatch)
    assert tuning.tune(fresh, tmp_path) == {} and kernels.PLANS == {}
    assert all(
        kernels.path_of(lin, m) == kernels.default_path(m, 2)
        for lin in tuning.linears_of(fresh.weights)
        for m in M_BUCKETS
    )
    monkeypatch.setenv(tuning.ENV, "fastest")
    with pytest.raises(
        ValueError, match="SPECDEC_KERNELS must be one of plan, measure, rules, plain .or unset: 'plan'.; not 'fastest'"
    ):
        tuning.tune(fresh, tmp_path)


def test_whole_passes_decide_between_openblas_s_plan_and_the_rules(monkeypatch):
    """A fake clock: a pass costs 1 on OpenBLAS's threads, 2 on the workers but 0.5 for 5 tokens (the first
    matrix's path says which). OpenBLAS's plan survives only in the buckets where its passes are faster."""
    model = split_llama(monkeypatch)
    linears = tuning.linears_of(model.weights)
    now, passes = [0.0], []

    class Cache:
        def rollback(self, n):
            assert n == tuning.CONTEXT

    def fake_forward(tokens, cache):
        passes.append(len(tokens))
        path, m = kernels.path_of(linears[0], len(tokens)), len(tokens)
        now[0] += (0.5 if m == 5 else 2.0) if path == "workers" else 1.0

    monkeypatch.setattr(model, "forward", fake_forward)
    monkeypatch.setattr(model, "new_cache", Cache)
    blas = ["gemvs" if m in (2, 3) else "blas" for m in M_BUCKETS]
    measured = {kernels.shape_key(lin): blas for lin in linears}
    kept = tuning.confirm(model, linears, measured, repeats=3, clock=lambda: now[0])
    rules = [kernels.default_path(m, 2) for m in M_BUCKETS]  # workers up to MAX_SPLIT_ROWS, then blas
    fits = [tuning.CONTEXT + m <= model.n_ctx for m in M_BUCKETS]  # 33 and 65 new tokens do not fit this toy
    expected = [b if fit and m != 5 else r for m, b, r, fit in zip(M_BUCKETS, blas, rules, fits)]
    assert kept == {key: expected for key in measured}
    assert expected[:4] == ["blas", "gemvs", "gemvs", "workers"]
    assert passes[0] == tuning.CONTEXT and max(passes[1:]) <= model.n_ctx - tuning.CONTEXT
    assert kernels.PLANS == {}, "confirm leaves no plan behind"


def test_openblas_s_threads_must_win_clearly(monkeypatch):
    """A bucket where OpenBLAS's passes are faster by less than CONFIRM_MARGIN keeps the rules (the workers,
    which a busy machine slows in proportion); one where they are faster by more takes OpenBLAS's plan."""
    model = split_llama(monkeypatch)
    linears = tuning.linears_of(model.weights)
    now = [0.0]

    class Cache:
        def rollback(self, n):
            pass

    def fake_forward(tokens, cache):  # workers 1.0 a pass; OpenBLAS 0.9 (10% faster) for 2 tokens, 0.5 for 3
        path, m = kernels.path_of(linears[0], len(tokens)), len(tokens)
        now[0] += 1.0 if path == "workers" else {2: 0.9, 3: 0.5}.get(m, 1.0)

    monkeypatch.setattr(model, "forward", fake_forward)
    monkeypatch.setattr(model, "new_cache", Cache)
    measured = {kernels.shape_key(lin): ["blas"] * len(M_BUCKETS) for lin in linears}
    kept = tuning.confirm(model, linears, measured, repeats=3, clock=lambda: now[0])
    plan = next(iter(kept.values()))
    assert plan[M_BUCKETS.index(2)] == "workers" and plan[M_BUCKETS.index(3)] == "blas"
    assert tuning.CONFIRM_MARGIN > 1.1


@needs_blas
def test_a_model_loaded_later_keeps_the_plans_of_shapes_already_known(monkeypatch, tmp_path):
    model = split_llama(monkeypatch)
    keys = {kernels.shape_key(lin) for lin in tuning.linears_of(model.weights)}
    new_shape = Linear(np.ones((80, 32), np.float32), None)  # a shape the model does not have
    answers = [
        {k: ["one"] * len(M_BUCKETS) for k in keys},
        {k: ["blas"] * len(M_BUCKETS) for k in keys | {kernels.shape_key(new_shape)}},
    ]
    monkeypatch.setattr(tuning, "measure", lambda linears, repeats=None, clock=None: answers.pop(0))
    monkeypatch.setattr(tuning, "confirm", lambda model, linears, plan: plan)
    monkeypatch.delenv(tuning.ENV, raising=False)
    tuning.tune(model, tmp_path)
    other = split_llama(monkeypatch)
    other.weights.lm_head = new_shape  # so this model is measured
    known = tuning.tune(other, tmp_path)
    assert all(known[k] == ["one"] * len(M_BUCKETS) for k in keys), "the first model's threads stay as they were"
    assert known[kernels.shape_key(new_shape)] == ["blas"] * len(M_BUCKETS) and kernels.PLANS[keys.pop()][0] == "one"


@needs_blas
def test_a_plan_that_cannot_be_kept_is_said_and_still_used(monkeypatch, tmp_path):
    model = split_llama(monkeypatch)
    monkeypatch.setattr(tuning, "confirm", lambda model, linears, plan: plan)
    monkeypatch.setattr(tuning, "REPEATS", 1)
    monkeypatch.delenv(tuning.ENV, raising=False)
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    said = []
    plans = tuning.tune(model, blocked, said.append)
    assert plans and kernels.PLANS and blocked.read_text() == ""
    assert len(said) == 2 and said[1].startswith("could not keep the timings in"), said


def test_confirm_takes_its_plans_off_the_matrices_even_when_a_pass_fails(monkeypatch):
    model = split_llama(monkeypatch)
    linears = tuning.linears_of(model.weights)

    def failing_forward(tokens, cache):
        if len(tokens) != tuning.CONTEXT:
            raise KeyboardInterrupt

    monkeypatch.setattr(model, "forward", failing_forward)
    measured = {kernels.shape_key(lin): ["blas"] * len(M_BUCKETS) for lin in linears}
    kernels.PLANS["another model's shape"] = ("one",) * len(M_BUCKETS)
    with pytest.raises(KeyboardInterrupt):
        tuning.confirm(model, linears, measured)
    assert kernels.PLANS == {"another model's shape": ("one",) * len(M_BUCKETS)}, "PLANS as it was before"


@needs_blas
def test_openblas_s_count_is_put_back_whatever_the_threads_interleaving():
    import threading

    start = threads.BLAS.get()
    with threads.blas_threads(1):
        with threads.blas_threads(2):
            assert threads.BLAS.get() == 2
        assert threads.BLAS.get() == 1, "leaving an inner block puts back the enclosing one's count"
    assert threads.BLAS.get() == start
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        with threads.blas_threads(1):
            a_in.set()
            b_in.wait()
        a_out.set()

    def b():
        a_in.wait()
        with threads.blas_threads(3):
            b_in.set()
            a_out.wait()  # A leaves first, then B: the order that left OpenBLAS on one thread

    runs = [threading.Thread(target=f) for f in (a, b)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(10)
    assert threads.BLAS.get() == start
    assert threads.outside_count() == start


def test_unsplit_matrices_keep_the_default_rules(tmp_path):
    """A toy's matrices are below SMALL_BYTES: nothing to measure, no file written."""
    model = random_llama()
    assert tuning.tune(model, tmp_path) == {}
    assert list(tmp_path.iterdir()) == [] and kernels.PLANS == {}


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
            kernels.PLANS[kernels.shape_key(lin)] = (path,) * len(M_BUCKETS)
        cache = model.new_cache()
        logits = np.concatenate(
            [model.forward(tokens[:20], cache), model.forward(tokens[20:25], cache), model.forward(tokens[25:], cache)]
        )
        np.testing.assert_allclose(logits, reference, atol=1e-5, err_msg=path)


def test_a_plan_is_kept_for_the_openblas_spin_setting_it_was_measured_under(monkeypatch, tmp_path):
    path = tuning.plan_file(tmp_path)
    monkeypatch.setattr(tuning, "OPENBLAS_SPIN", tuning.OPENBLAS_SPIN + "0")
    assert tuning.plan_file(tmp_path) != path, "another spin setting gets a plan file of its own"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    read = []
    for first, extra in [
        ("pass", {}),
        ("import numpy", {}),
        ("pass", {"OPENBLAS_THREAD_TIMEOUT": "7"}),
        ("import numpy", {"OPENBLAS_THREAD_TIMEOUT": "7"}),
    ]:
        code = f"{first}; import specdec; print(specdec.OPENBLAS_SPIN)"
        run = subprocess.run([sys.executable, "-c", code], env=env | extra, capture_output=True, text=True, check=True)
        read.append(run.stdout.strip())
    assert read == ["4", "default", "7", "7"], "specdec's setting, OpenBLAS's default (NumPy loaded first), the user's"
