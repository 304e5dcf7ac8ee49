"""The distilled draft model (specdec/train/draft_model.py) on a tiny random chat Llama: the divergences and the
whole draft's loss against finite differences (float64), a run through the command line whose file loads as a
Llama and keeps greedy output, and speculative sampling with such a draft keeping the target's distribution at
T=1 (a broken verifier failing the same check)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import (
    N_BROKEN,
    N_SAMPLES,
    PROMPT,
    assert_grads_match,
    chi_square_passes,
    exact_continuations,
    sample_many,
    verify_resample_target_on_reject,
)
from test_distill import POOL, SETTINGS, chat_model

from specdec import verify
from specdec.autoregressive import autoregressive_sample
from specdec.checkpoints import draft
from specdec.model.llama import Llama, LlamaHParams, random_llama
from specdec.model.restricted import DraftVocab
from specdec.model.tokenizer import chat_prompt
from specdec.sampling import SamplingParams
from specdec.speculative import speculative_sample
from specdec.train import draft_model as dm
from specdec.train import heads_train as ht
from specdec.train import rows as tr
from specdec.train.cli import main
from specdec.train.distill import make_data
from specdec.train.shards import load_distill_data


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distill")
    model = chat_model(scale=1.0)
    make_data(model, folder, 400, POOL, **{**SETTINGS, "max_reply": 24, "greedy_frac": 0.75})
    return model, folder


@pytest.mark.parametrize("loss", dm.LOSSES)
def test_each_divergence_has_its_value_and_the_gradient_of_finite_differences(loss):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 7))
    p = rng.dirichlet(np.ones(7), size=5) * np.array([[1.0], [0.9], [1.0], [0.7], [1.0]])  # some mass outside
    p[0, 3] = 0  # a token the target gives nothing
    value, grad = dm.divergence(logits, p, loss)
    q = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    if loss == "fkl":
        expected = np.mean([sum(pj * np.log(pj / qj) for pj, qj in zip(pr, qr) if pj > 0) for pr, qr in zip(p, q)])
    else:  # 1 - acceptance of one speculative step, 1 - sum min(p, q) (the mass outside: p > q = 0 there)
        expected = np.mean(1 - np.minimum(p, q).sum(axis=-1))
    assert np.isclose(value, expected)
    assert_grads_match(lambda: dm.divergence(logits, p, loss)[0], {"logits": logits}, {"logits": grad}, n=20)


@pytest.mark.parametrize("loss", dm.LOSSES)
def test_the_whole_draft_loss_has_the_gradient_of_finite_differences(shards, loss):
    """Embedding (frozen) -> two Llama blocks (train/llama_grad.py) -> final norm -> restricted tied head -> loss."""
    model, folder = shards
    data = load_distill_data(folder, model)
    rows = [0, 1, 2]
    states = ht.row_states(model, data, rows, [], progress=False)  # the draft reads no states: no target pass
    vocab = DraftVocab.of(model, np.arange(0, model.n_vocab, 3))
    vocab = DraftVocab(vocab.ids, vocab.w.astype(np.float64), vocab.n_vocab)  # float64 for the differences
    batch = tr.make_batch(data, rows, states, vocab)
    shape = dm.draft_shape(model, [1, 0], 40)
    h = dm.draft_hparams(model, shape)
    rng = np.random.default_rng(1)
    params = {
        k: v.astype(np.float64) + 0.05 * rng.standard_normal(v.shape) for k, v in dm.init_params(model, shape).items()
    }
    wte = model.weights.wte.astype(np.float64)
    value, grads = dm.loss_and_grads(params, wte, vocab, batch, h, loss)
    assert np.isfinite(value) and set(grads) == set(params)
    assert_grads_match(lambda: dm.loss_and_grads(params, wte, vocab, batch, h, loss)[0], params, grads, n=3)


def test_the_training_forward_is_the_inference_model_in_float32(shards):
    """forward() over padded rows gives the logits the built draft (a RestrictedLlama) computes with its KV cache;
    float32 in, float32 gradients out."""
    model, folder = shards
    data = load_distill_data(folder, model)
    shape = dm.draft_shape(model, [1], None)
    params = dm.init_params(model, shape)
    vocab = DraftVocab.of(model, np.arange(0, model.n_vocab, 2))
    batch = tr.make_batch(data, [0, 5], ht.row_states(model, data, [0, 5], [], False), vocab)
    y, _ = dm.forward(params, model.weights.wte, batch.tokens, batch.lengths, dm.draft_hparams(model, shape))
    assert y.dtype == np.float32
    _, grads = dm.loss_and_grads(params, model.weights.wte, vocab, batch, dm.draft_hparams(model, shape), "fkl")
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}  # float32 end to end
    built = draft.build_draft(model, shape, params, vocab.ids)
    for b, length in enumerate(batch.lengths):
        full = built(batch.tokens[b, :length])  # [length, n_vocab], -inf outside the vocabulary
        np.testing.assert_allclose(dm.head_logits(y[b, :length], vocab), full[:, vocab.ids], rtol=1e-4, atol=1e-4)


def test_a_distilled_draft_trains_loads_as_a_llama_and_keeps_greedy_output(shards, tmp_path, monkeypatch):
    model, folder = shards
    from specdec.checkpoints import load

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: model)  # the tiny chat model as "tiny"
    out = tmp_path / "draft"
    flags = {
        "--model": "tiny",
        "--data": folder,
        "--out": out,
        "--vocab-top": 100,
        "--epochs": 20,
        "--lr": 3e-3,
        "--batch-tokens": 256,
        "--held-out": 0.3,
        "--layers": 0,
        "--loss": "fkl",
    }
    args = ["draft", *(str(part) for pair in flags.items() for part in pair), "--quiet"]
    assert main(args) == 0
    card = json.loads((out / draft.CONFIG_FILE).read_text())["card"]
    assert card["data"]["rows_held_out"] > 0 and card["loss"] == "fkl" and card["init_layers"] == [0]
    assert set(card["held_out"]["trained"]) == {"top1", "top5", "positions", "top1_by_position"}
    assert card["command"].startswith("python -m specdec.train")
    trained = draft.load_draft(model, out)
    assert isinstance(trained, Llama) and trained.n_layer == 1
    # The rows it trained on it must have learned (a random model's replies are too few to generalise from).
    data = load_distill_data(folder, model)
    rows = [r for r in range(len(data.replies)) if not tr.held_out_rows(data, 0.3)[r]]
    vocab = DraftVocab.of(model, trained.vocab.ids)
    kind, config = ht.KINDS["draft"], dict(card)
    states = ht.row_states(model, data, rows, [], False)
    params = {k: v.astype(np.float16).astype(np.float32) for k, v in dm.init_params(model, config).items()}
    before = tr.held_out_accuracy(kind, params, model, config, vocab, data, rows, states, 256)
    after_params = {
        f"blk.0.{n}": t.w_t if hasattr(t, "w_t") else t
        for n, t in trained.weights.blocks[0].checkpoint_tensors().items()
    }
    after = tr.held_out_accuracy(
        kind, {**after_params, "output_norm": trained.weights.norm_f}, model, config, vocab, data, rows, states, 256
    )
    assert after["top1"] > before["top1"] + 0.2, (before, after)
    prompt = model.tokenizer.encode("Hi there")
    ar = autoregressive_sample(model, prompt, 20, temperature=0.0)
    sd = speculative_sample(model, trained, prompt, 20, K=3, temperature=0.0)
    assert sd.tokens == ar.tokens and sd.drafted > 0
    assert main([*args[:-1], "--resume", "--quiet"]) == 0  # a finished run resumes to the same end


@pytest.mark.slow
def test_speculative_sampling_with_a_restricted_draft_keeps_the_target_distribution(monkeypatch):
    """A tiny target (6 tokens), its draft started from its layer 1 and restricted to 4 tokens: the exact law of
    every 3-token continuation at T=1 is reproduced; a verifier that resamples the target on rejection is not."""
    target = random_llama(
        LlamaHParams(n_vocab=6, n_ctx=32, n_embd=16, n_head=4, n_kv_head=2, n_layer=2, n_ff=24), seed=3, scale=0.5
    )
    shape = dm.draft_shape(target, [1], 16)
    params = {
        k: v + 0.1 * np.random.default_rng(4).standard_normal(v.shape).astype(np.float32)
        for k, v in dm.init_params(target, shape).items()
    }
    small = draft.build_draft(target, shape, params, np.array([0, 1, 3, 5]))
    exact = exact_continuations(target, PROMPT, 3, SamplingParams(1.0))

    def run(rng):
        return speculative_sample(target, small, PROMPT, 3, K=2, temperature=1.0, rng=rng)

    assert run(np.random.default_rng(0)).drafted > 0
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_SAMPLES), exact)
    assert ok, f"chi2={stat:.1f} df={df}"
    monkeypatch.setattr(verify, "sampled_chain", verify_resample_target_on_reject)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact)
    assert not ok, f"a broken verifier passed with the draft (chi2={stat:.1f})"


@pytest.mark.slow
def test_the_shipped_draft_loads_and_keeps_smollm2s_greedy_output(monkeypatch):
    """The real file through load_model (SmolLM2-135M fetched once with pip; SPECDEC_HOME keeps it)."""
    if draft.card() is None:
        pytest.skip(f"no shipped draft in {draft.FOLDER}; train it with {draft.train_command()}")
    from specdec import load_model

    target = load_model(draft.TARGET, progress=False)
    small = draft.load_draft(target)
    assert isinstance(small, Llama) and small.weights.wte is target.weights.wte
    prompt = chat_prompt(target.tokenizer, "Name three fruits.")
    ar = autoregressive_sample(target.astype(np.float64), prompt, 24, temperature=0.0)
    sd = speculative_sample(target.astype(np.float64), small, prompt, 24, K=4, temperature=0.0)
    assert sd.tokens == ar.tokens
