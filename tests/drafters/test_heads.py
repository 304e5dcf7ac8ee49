"""Medusa and EAGLE heads: every hand-written backward against finite differences, the
drafting forward against the training forward, AdamW, the draft vocabulary, head files.

Gradient checks run in float64 (the code is dtype-generic: it keeps float32 only
when given float32), with central differences on a sample of entries.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model
from helpers import assert_grads_match

from specdec.drafters import eagle, eagle_grad, medusa
from specdec.drafters.heads import (
    DraftVocab,
    HeadFileError,
    cross_entropy,
    load_heads,
    one_hot,
    save_heads,
    smooth_l1,
    top_tokens,
)
from specdec.model.gpt2 import GPT2, HParams, random_weights
from specdec.train.optim import AdamW

E, H, V = 8, 2, 13  # width, heads, vocabulary of the gradient-check problems


def test_the_gradient_check_catches_a_wrong_gradient():
    x = {"x": np.array([1.0, -2.0, 3.0])}
    with pytest.raises(AssertionError):
        assert_grads_match(lambda: float((x["x"] ** 3).sum()), x, {"x": 2 * x["x"]})  # should be 3 x^2


def vocab64(rng, ids=None) -> DraftVocab:
    w = rng.standard_normal((V, E))
    if ids is None:
        return DraftVocab(np.arange(V), w, V)
    return DraftVocab(np.asarray(ids), w[ids], V)


def soft_targets(rng, n, vocab: DraftVocab) -> np.ndarray:
    p = rng.dirichlet(np.ones(V), size=n)  # [n, V] over the full vocabulary
    return vocab.targets(p)  # restricted rows sum to < 1


@pytest.mark.parametrize("restricted", [False, True])
def test_cross_entropy_gradient(restricted):
    rng = np.random.default_rng(1)
    vocab = vocab64(rng, [0, 2, 3, 7, 11] if restricted else None)
    z = rng.standard_normal((6, len(vocab.ids)))
    p = soft_targets(rng, 6, vocab)
    _, dz = cross_entropy(z, p)
    assert_grads_match(lambda: cross_entropy(z, p)[0], {"z": z}, {"z": dz})


def test_cross_entropy_of_one_hot_labels_is_the_negative_log_likelihood():
    z = np.log(np.array([[0.5, 0.25, 0.25]]))
    loss, dz = cross_entropy(z, one_hot(np.array([1]), 3, np.float64))
    assert np.isclose(loss, -np.log(0.25))
    assert np.allclose(dz, [[0.5, -0.75, 0.25]])


def test_smooth_l1_value_and_gradient():
    rng = np.random.default_rng(2)
    pred, target = rng.standard_normal((5, 4)) * 2, rng.standard_normal((5, 4))
    loss, d = smooth_l1(pred, target)
    diff = pred - target
    expected = np.where(np.abs(diff) < 1, 0.5 * diff**2, np.abs(diff) - 0.5).mean()
    assert np.isclose(loss, expected)
    assert_grads_match(lambda: smooth_l1(pred, target)[0], {"pred": pred}, {"pred": d})


@pytest.mark.parametrize("restricted", [False, True])
def test_medusa_gradients(restricted):
    rng = np.random.default_rng(3)
    vocab = vocab64(rng, [1, 4, 5, 6, 9, 12] if restricted else None)
    params = {"w": rng.standard_normal((3, E, E)) * 0.5, "b": rng.standard_normal((3, E)) * 0.5}  # not zero: SiLU bends
    hs = [rng.standard_normal((7 - i, E)) for i in range(3)]  # head i has fewer rows, as near a sequence end
    targets = [soft_targets(rng, 7 - i, vocab) for i in range(3)]
    _, _, grads = medusa.loss_and_grads(params, hs, targets, vocab)
    assert_grads_match(lambda: medusa.loss_and_grads(params, hs, targets, vocab)[0], params, grads)


def test_medusa_resblock_input_gradient():
    rng = np.random.default_rng(4)
    w, b, h = rng.standard_normal((E, E)), rng.standard_normal(E), rng.standard_normal((5, E))
    c = rng.standard_normal((5, E))  # loss = sum(c * r)

    def loss():
        return float((c * medusa.resblock(h, w, b)[0]).sum())

    r, saved = medusa.resblock(h, w, b)
    dw, db, dh = medusa.resblock_backward(c, h, w, saved)
    assert_grads_match(loss, {"w": w, "b": b, "h": h}, {"w": dw, "b": db, "h": dh})


def test_untrained_medusa_head_is_the_lm_head():
    target = tiny_model()
    vocab = DraftVocab.of(target)
    h = np.random.default_rng(0).standard_normal((3, target.n_embd)).astype(np.float32)
    logits = medusa.head_logits(medusa.init_params(2, target.n_embd), h, vocab)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, np.stack([h @ target.weights.wte.T] * 2), rtol=1e-5, atol=1e-5)


def test_layer_norm_gelu_and_attention_gradients():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, E))
    c = rng.standard_normal((2, 3, E))
    params = {"ln.weight": 1 + rng.standard_normal(E) * 0.3, "ln.bias": rng.standard_normal(E) * 0.3}

    grads = {k: np.zeros_like(v) for k, v in params.items()}
    y, saved = eagle_grad.layer_norm(x, params, "ln", 1e-5)
    dx = eagle_grad.layer_norm_backward(c, params, "ln", saved, grads)
    assert_grads_match(
        lambda: float((c * eagle_grad.layer_norm(x, params, "ln", 1e-5)[0]).sum()),
        {**params, "x": x},
        {**grads, "x": dx},
    )

    dgelu = eagle_grad.gelu_backward(c, x)
    assert_grads_match(lambda: float((c * eagle_grad.gelu(x)).sum()), {"x": x}, {"x": dgelu})

    q, k, v = (rng.standard_normal((2, H, 4, E // H)) for _ in range(3))
    co = rng.standard_normal((2, H, 4, E // H))
    out, P = eagle_grad.causal_attention(q, k, v)
    dq, dk, dv = eagle_grad.causal_attention_backward(co, q, k, v, P)
    qkv = {"q": q, "k": k, "v": v}
    assert_grads_match(
        lambda: float((co * eagle_grad.causal_attention(q, k, v)[0]).sum()), qkv, {"q": dq, "k": dk, "v": dv}
    )


@pytest.mark.parametrize("restricted", [False, True])
def test_eagle_gradients_of_every_parameter(restricted):
    rng = np.random.default_rng(6)
    vocab = vocab64(rng, [0, 1, 2, 3, 5, 8] if restricted else None)
    params = {k: v.astype(np.float64) for k, v in eagle_grad.init_params(E, rng, std=0.3).items()}
    for name in params:  # move gains and biases off their initial 1 and 0
        if params[name].ndim == 1:
            params[name] += rng.standard_normal(params[name].shape) * 0.3
    B, T = 2, 4
    f, emb, f_next = (rng.standard_normal((B, T, E)) for _ in range(3))
    p = soft_targets(rng, B * T, vocab)

    def loss():
        return eagle_grad.loss_and_grads(params, f, emb, f_next, p, vocab, H, 1e-5)[0]

    _, _, grads, _ = eagle_grad.loss_and_grads(params, f, emb, f_next, p, vocab, H, 1e-5)
    assert_grads_match(loss, params, grads, n=8)


def test_eagle_drafting_forward_equals_the_training_forward():
    """One pair at a time through gpt2.transformer_block and a KV cache == the teacher-forced batch."""
    rng = np.random.default_rng(7)
    e, n_head, T = 32, 4, 6
    params = eagle_grad.init_params(e, rng, std=0.2)
    f = rng.standard_normal((1, T, e)).astype(np.float32)
    emb = rng.standard_normal((1, T, e)).astype(np.float32)
    y_train, _ = eagle_grad.forward(params, f, emb, n_head, 1e-5)
    model = eagle.EagleModel(params, e, n_head, n_ctx=64, eps=1e-5)
    cache = model.new_cache()
    y_first = model.step(f[0, :2], emb[0, :2], cache)  # several pairs at once, then one at a time
    y_rest = [model.step(f[0, j : j + 1], emb[0, j : j + 1], cache) for j in range(2, T)]
    y_draft = np.concatenate([y_first, *y_rest])
    assert y_train.dtype == y_draft.dtype == np.float32
    np.testing.assert_allclose(y_draft, y_train[0], rtol=1e-4, atol=1e-5)


def test_adamw_first_step_is_lr_times_the_gradient_sign_and_it_minimises_a_quadratic():
    w = {"w": np.array([[3.0, -2.0]], np.float32), "b": np.array([1.0], np.float32)}
    opt = AdamW(w, lr=0.1)
    opt.step({"w": np.array([[0.5, -4.0]], np.float32), "b": np.array([2.0], np.float32)})
    np.testing.assert_allclose(w["w"], [[2.9, -1.9]], rtol=1e-5)  # bias-corrected: m/sqrt(v) = sign(g)
    for _ in range(300):
        opt.step({"w": 2 * w["w"], "b": 2 * w["b"]})  # gradient of |w|^2 + b^2
    assert np.abs(w["w"]).max() < 0.05 and abs(w["b"][0]) < 0.05
    decayed = {"w": np.ones((2, 2), np.float32)}
    AdamW(decayed, lr=0.1, weight_decay=0.5).step({"w": np.zeros((2, 2), np.float32)})
    np.testing.assert_allclose(decayed["w"], 0.95, rtol=1e-6)  # decoupled decay: w -= lr * wd * w


def test_top_tokens_and_the_restricted_vocabulary():
    assert list(top_tokens(np.array([5, 5, 5, 2, 2, 9, 0]), 2, 10)) == [2, 5]
    assert list(top_tokens(np.array([4, 1]), 3, 10)) == [0, 1, 4]  # ties (count 0) go to the lowest ids
    target = tiny_model()
    vocab = DraftVocab.of(target, [3, 1, 3, 7])
    assert list(vocab.ids) == [1, 3, 7] and vocab.restricted
    full = vocab.full(np.array([[1.0, 2.0, 3.0]], np.float32))
    assert full.shape == (1, target.n_vocab) and np.isneginf(full[0, 0]) and full[0, 7] == 3
    with pytest.raises(ValueError, match="draft vocabulary ids"):
        DraftVocab.of(target, [target.n_vocab])


def test_head_files_round_trip_and_refuse_other_models(tmp_path):
    target = tiny_model(seed=0)
    vocab = DraftVocab.of(target, np.arange(0, 200, 3))
    params = medusa.init_params(2, target.n_embd)
    params["w"] += 1
    save_heads(tmp_path / "m", "medusa", target, params, {"n_heads": 2}, vocab)
    config, loaded, vocab2 = load_heads(tmp_path / "m", "medusa", target, medusa.param_shapes)
    assert config["n_heads"] == 2 and config["model"] == target.name
    np.testing.assert_array_equal(loaded["w"], params["w"])
    np.testing.assert_array_equal(vocab2.ids, vocab.ids)

    with pytest.raises(HeadFileError, match="not 'eagle'"):
        load_heads(tmp_path / "m", "eagle", target, eagle.param_shapes)
    with pytest.raises(HeadFileError, match="other weights"):
        load_heads(tmp_path / "m", "medusa", tiny_model(seed=1), medusa.param_shapes)
    wide = HParams(n_vocab=target.n_vocab, n_ctx=64, n_embd=48, n_head=4, n_layer=2)
    with pytest.raises(HeadFileError, match="n_embd=32, but the target 'wide' has n_embd=48"):
        load_heads(tmp_path / "m", "medusa", GPT2(wide, random_weights(wide), name="wide"), medusa.param_shapes)
    with pytest.raises(HeadFileError, match="no trained heads"):
        load_heads(tmp_path / "nothing", "medusa", target, medusa.param_shapes)


def test_medusa_drafters_fused_heads_equal_the_training_forward():
    target = tiny_model()
    rng = np.random.default_rng(8)
    params = {
        "w": rng.standard_normal((3, 32, 32)).astype(np.float32) * 0.3,
        "b": rng.standard_normal((3, 32)).astype(np.float32) * 0.3,
    }
    drafter = medusa.MedusaDrafter(params, DraftVocab.of(target, np.arange(0, 262, 2)))
    h = rng.standard_normal((1, 32)).astype(np.float32)
    drafter.commit([1, 2], h)
    expected = medusa.head_logits(params, h, drafter.vocab)[:, 0]  # [3, N]
    np.testing.assert_allclose(drafter.logits(3), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(drafter.logits(2), expected[:2], rtol=1e-4, atol=1e-4)
