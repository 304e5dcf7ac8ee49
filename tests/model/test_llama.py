"""The Llama architecture (specdec/model/llama.py): the math on a tiny random model, then SmolLM2-135M-Instruct
against transformers' logits for the same GGUF file (tests/fixtures/make_smollm2_reference.py made them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import BROKEN_RULES, chi_square_passes, sample_many

import specdec.verify as verify
from specdec import autoregressive_sample, speculative_sample
from specdec.checkpoints.gguf import load_gguf, unpermute_rows
from specdec.checkpoints.gguf_file import GGUFFile
from specdec.model.llama import LlamaHParams, grouped_attention, random_llama, rms_norm, silu
from specdec.model.tokenizer import chat_prompt
from specdec.interfaces import Proposal
from specdec.sampling import SamplingParams, draw, probabilities

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_reference.npz"


# --- the math, on a tiny random Llama --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return random_llama(seed=3, scale=0.3)


def test_cached_steps_equal_one_pass_and_a_tree_equals_its_chains(tiny):
    tokens = [5, 9, 2, 33, 7, 61]
    whole = tiny(tokens)
    cache = tiny.new_cache()
    stepped = np.concatenate([tiny.forward(tokens[:3], cache), *(tiny.forward([t], cache) for t in tokens[3:])])
    np.testing.assert_allclose(stepped, whole, atol=1e-5)
    # A tree [root, a, b] with b a sibling of a: b's row equals the chain [root, b] (same position, not the next).
    cache = tiny.new_cache()
    tiny.forward(tokens[:3], cache)
    tree = tiny.forward([tokens[3], 7, 61], cache, parents=[-1, 0, 0])
    fresh = tiny.new_cache()
    tiny.forward(tokens[:3], fresh)
    np.testing.assert_allclose(tree[[0, 2]], tiny.forward([tokens[3], 61], fresh), atol=1e-5)
    # keep() compacts the accepted path [root, b]: the next step matches a plain pass over that text.
    cache.keep(3, [0, 2])
    np.testing.assert_allclose(tiny.forward([1], cache), tiny([*tokens[:4], 61, 1])[-1:], atol=1e-5)


def test_early_exit_hidden_states_and_float64(tiny):
    tokens = [1, 2, 3, 4]
    logits, hidden = tiny.forward(tokens, tiny.new_cache(), return_hidden=True)
    assert logits.dtype == hidden.dtype == np.float32 and hidden.shape == (4, tiny.n_embd)
    np.testing.assert_allclose(hidden @ tiny.weights.wte.T, logits, atol=1e-5)  # tied LM head
    one = tiny.forward(tokens, tiny.new_cache(), n_layer=1)
    assert not np.allclose(one, logits)  # one block is not two
    wide = tiny.astype(np.float64)
    out = wide(tokens)
    assert out.dtype == np.float64 and np.allclose(out, logits, atol=1e-4)


def test_grouped_query_attention_is_each_query_head_on_its_own_kv_head():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(6, 3, 8), (2, 5, 8), (2, 5, 8)])
    bias = np.where(np.tri(3, 5, 2, dtype=bool), 0, -np.inf).astype(np.float32)
    out = grouped_attention(q, k, v, bias, n_kv_head=2)
    for h in range(6):  # head h reads kv head h // 3, as transformers' repeat_kv gives it
        s = q[h] @ k[h // 3].T / np.sqrt(8) + bias
        w = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(out[h], (w / w.sum(-1, keepdims=True)) @ v[h // 3], atol=1e-5)


def test_rms_norm_and_the_rows_unpermuted():
    x = np.array([[3.0, 4.0]], np.float32)
    np.testing.assert_allclose(rms_norm(x, np.array([1.0, 2.0], np.float32), 0.0), [[3 / 12.5**0.5, 8 / 12.5**0.5]])
    # llama.cpp's converter: rows (head, half, i) -> (head, i, half); unpermute_rows reverses it.
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)
    permuted = w.reshape(2, 2, 4, 3).swapaxes(1, 2).reshape(16, 3)
    np.testing.assert_array_equal(unpermute_rows(permuted, 2), w)


def test_silu_is_x_times_sigmoid_without_overflow_warnings():
    x = np.float32([-1000, -20, -1, 0, 0.5, 3, 1000])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = silu(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x * (0.5 + 0.5 * np.tanh(x.astype(np.float64) / 2)), rtol=1e-6, atol=1e-30)


def test_hyperparameters_are_checked():
    with pytest.raises(ValueError, match="groups of n_kv_head"):
        LlamaHParams(n_vocab=8, n_ctx=8, n_embd=12, n_head=4, n_kv_head=3, n_layer=1, n_ff=8)


def test_greedy_speculative_equals_greedy_autoregressive_on_a_tiny_llama(tiny):
    plain = autoregressive_sample(tiny, [1, 2, 3], 20).tokens
    for draft, tree in [("early_exit:1", None), ("ngram", None), ("early_exit:1", 6), ("ngram", "auto")]:
        assert speculative_sample(tiny, draft, [1, 2, 3], 20, K=3, tree=tree).tokens == plain, (draft, tree)


# --- SmolLM2-135M-Instruct against transformers ----------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return load_gguf(smollm2_gguf, name="smollm2-135m")


@pytest.fixture(scope="module")
def ref():
    with np.load(REFERENCE, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def assert_rows_match(logits, ref, prefix, atol=1e-3):
    cols = ref["cols"]
    np.testing.assert_allclose(logits[:, cols], ref[f"{prefix}_cols"], atol=atol, rtol=0)
    np.testing.assert_allclose(logits[-1], ref[f"{prefix}_last"], atol=atol, rtol=0)
    m = logits.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(-1))
    np.testing.assert_allclose(lse, ref[f"{prefix}_lse"], atol=atol, rtol=0)
    top = np.take_along_axis(logits, ref[f"{prefix}_top_ids"], axis=-1)
    np.testing.assert_allclose(top, ref[f"{prefix}_top_vals"], atol=atol, rtol=0)


def test_logits_equal_transformers_whole_prompt_and_through_the_cache(smollm2, ref):
    for i in range(len(json.loads(str(ref["prompts"])))):
        assert_rows_match(smollm2(ref[f"prompt_{i}"]), ref, f"logits_{i}")
    ids = ref["prompt_0"].tolist()
    n, cache = len(ids), smollm2.new_cache()
    rows = [
        smollm2.forward(ids[: n - 4], cache)[-1:],
        smollm2.forward(ids[n - 4 : n - 3], cache),
        smollm2.forward(ids[n - 3 :], cache),
    ]
    assert_rows_match(np.concatenate(rows), ref, "cached")


def test_greedy_continuations_equal_transformers(smollm2, ref):
    for i in range(len(json.loads(str(ref["prompts"])))):
        out = autoregressive_sample(smollm2, ref[f"prompt_{i}"].tolist(), len(ref[f"greedy_{i}"]))
        assert out.tokens == ref[f"greedy_{i}"].tolist(), smollm2.tokenizer.decode(out.tokens)
    assert smollm2.tokenizer.decode(ref["greedy_0"].tolist()).startswith(" Paris")


def test_every_tensor_dequantizes_as_the_gguf_package_does(smollm2_gguf, ref):
    f = GGUFFile(smollm2_gguf)
    rows = json.loads(str(ref["dequant"]))
    assert {r["name"] for r in rows} == set(f.tensors)
    for r in rows:
        t = f.tensors[r["name"]]
        assert t.qtype.name == r["type"] and list(t.shape) == r["shape"], r["name"]
        values = f.tensor(r["name"]).astype(np.float64).reshape(-1)
        np.testing.assert_allclose(values[r["idx"]], r["values"], rtol=0, atol=0, err_msg=r["name"])
        assert np.isclose(values.sum(), r["sum"], rtol=1e-9, atol=1e-6), r["name"]
        assert np.isclose(np.square(values).sum(), r["sumsq"], rtol=1e-9), r["name"]


def test_the_tokenizer_equals_smollm2s(smollm2, ref):
    tok = smollm2.tokenizer
    for j, text in enumerate(json.loads(str(ref["tokenizer_texts"]))):
        assert tok.encode(text, allowed_special="all") == ref[f"tokenizer_ids_{j}"].tolist(), text
    # Digits: ids from SmolLM2's own pre-tokenizer (every digit alone, then GPT-2's pattern in between).
    for j, text in enumerate(json.loads(str(ref["digit_texts"]))):
        assert tok.encode(text) == ref[f"digit_ids_{j}"].tolist(), text
    pieces = [tok.decode([t]) for t in tok.encode("In 2024,  x1")]
    assert pieces == ["In", " ", "2", "0", "2", "4", ",", " ", " x", "1"]  # a space before a digit: its own piece
    assert tok.encode("In 2024") != tok.encode("In 2024".replace(" 2", "2"))
    with pytest.raises(ValueError, match="no token for the character"):
        tok.encode("end of transmission \x04")
    assert tok.decode(chat_prompt(tok, "Hi")).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_greedy_speculative_equals_greedy_autoregressive_on_smollm2(smollm2):
    prompt = chat_prompt(smollm2.tokenizer, "Repeat exactly: the quick brown fox jumps over the lazy dog.")
    plain = autoregressive_sample(smollm2, prompt, 24).tokens
    for draft, tree in [("ngram", None), ("early_exit:20", None), ("ngram", 6), ("early_exit:20", "auto")]:
        assert speculative_sample(smollm2, draft, prompt, 24, K=4, tree=tree).tokens == plain, (draft, tree)


@pytest.mark.slow
def test_the_verification_rule_on_smollm2s_own_distributions_is_exact_with_top_k(smollm2, monkeypatch):
    """One round (K=1) on SmolLM2's real rows at T=1, top-k 4: the target row p0 after a prompt, the draft row q0
    from its first 29 layers (earlier exits share almost no top-4 token with the target here), and p1 = p(. | prompt, x0) for every x0 either can produce. The round emits x0 (an
    accepted draft, or the target's correction) and, after an accepted draft, the bonus x1; a rejected round's
    x1 comes from p1[x0], as the next round would give it. The pair must follow p0(x0) p1[x0](x1) exactly;
    deliberately broken rules run through the same check and fail."""
    prompt = smollm2.tokenizer.encode("I like to eat")
    params = SamplingParams(1.0, top_k=4)
    logits0 = smollm2(prompt)[-1]
    q0 = probabilities(smollm2.forward(prompt, smollm2.new_cache(), last_only=True, n_layer=29), params)[0]
    p0 = probabilities(logits0[None], params)[0]
    rows1 = {int(x): smollm2([*prompt, int(x)])[-1] for x in np.union1d(np.flatnonzero(p0), np.flatnonzero(q0))}
    p1 = {x: probabilities(row[None], params)[0] for x, row in rows1.items()}
    exact = {
        (int(x0), int(x1)): float(p0[x0] * p1[int(x0)][x1])
        for x0 in np.flatnonzero(p0)
        for x1 in np.flatnonzero(p1[int(x0)])
    }

    def one_round(rng):
        d0 = draw(q0, rng)
        path, last = verify.verify(Proposal.chain([d0], q0[None]), np.stack([logits0, rows1[d0]]), params, rng)
        if not path and last not in p1:  # a token no correct rule emits here (a broken rule may)
            return type("Out", (), {"tokens": [last, -1]})
        pair = (d0, last) if path else (last, draw(p1[last], rng))
        return type("Out", (), {"tokens": list(pair)})

    ok, stat, df = chi_square_passes(sample_many(one_round, n_samples=6_000), exact)
    assert ok, f"chi2={stat:.1f} df={df}"
    for broken in BROKEN_RULES:
        monkeypatch.setattr(verify, "sampled_chain", broken)
        try:
            ok, stat, df = chi_square_passes(sample_many(one_round, n_samples=2_500), exact)
        except AssertionError:  # it emitted a pair of probability 0
            ok, stat, df = False, float("inf"), 0
        assert not ok, f"{broken.__name__} passed (chi2={stat:.1f}, df={df})"


def test_chat_wraps_the_prompt_and_both_decoders_stop_at_the_end_of_the_reply(smollm2, tiny):
    question = "What is the capital of France?"
    plain = autoregressive_sample(smollm2, question, 40, chat=True)
    assert smollm2.tokenizer.decode(plain.tokens) == "The capital of France is Paris.<|im_end|>"
    for draft in ("ngram", "early_exit:20"):
        assert speculative_sample(smollm2, draft, question, 40, K=4, chat=True).tokens == plain.tokens
    with pytest.raises(ValueError, match="chat needs a chat model"):
        autoregressive_sample(tiny, [1, 2], 4, chat=True)
    with pytest.raises(ValueError, match="pass text, not token ids"):
        speculative_sample(smollm2, "ngram", [1, 2], 4, chat=True)


# --- drafters take a Llama as they take a GPT2 ------------------------------------------------


def test_a_llama_passed_as_the_draft_is_a_model_drafter(tiny):
    draft = random_llama(LlamaHParams(**{**vars(tiny.hparams), "n_layer": 1}), seed=4, scale=0.3)
    expected = autoregressive_sample(tiny, [3, 1, 4], 16).tokens
    for K, tree in ((1, None), (4, None), ("auto", None), (3, 6)):
        assert speculative_sample(tiny, draft, [3, 1, 4], 16, K=K, tree=tree).tokens == expected, (K, tree)
    assert speculative_sample(tiny, tiny, [3, 1, 4], 16, K=4).alpha == 1.0


def test_a_restricted_llama_scores_only_its_tokens_and_stays_exact(tiny):
    from specdec.drafters.restricted import RestrictedLlama, restrict

    ids = [0, 2, 5, 7, 11, 13]
    draft = restrict(tiny, len(ids), corpus_ids=ids * 3)
    assert isinstance(draft, RestrictedLlama)
    tokens = [3, 1, 4, 1, 5]
    logits, full = draft(tokens), tiny(tokens)
    np.testing.assert_allclose(logits[:, ids], full[:, ids], atol=1e-5)  # the same scores on the draft vocabulary
    assert np.isneginf(np.delete(logits, ids, axis=1)).all()  # and none elsewhere
    expected = autoregressive_sample(tiny, tokens, 16).tokens
    assert speculative_sample(tiny, draft, tokens, 16, K=3).tokens == expected
    with pytest.raises(ValueError, match="GPT-2 or Llama model"):
        restrict(object(), 10)


def test_heads_self_distil_smollm2_from_its_chat_template(smollm2):
    """A chat model's training sequences start with its system turn and an open user turn."""
    from specdec.train.data import start_tokens

    text = smollm2.tokenizer.decode(start_tokens(smollm2))
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>user\n")


# --- every drafter on a Llama: greedy speculative equals greedy autoregressive ----------------


def write_untrained_heads(folder, target, ids) -> dict[str, str]:
    """Medusa and EAGLE heads at their initialisation (EAGLE's randomised), saved as training saves them:
    draft specs for both. Untrained heads draft badly; greedy output must equal the target's anyway."""
    from specdec.drafters import eagle_grad, medusa
    from specdec.drafters.heads import DraftVocab, save_heads

    vocab = DraftVocab.of(target, ids)
    params = {
        "medusa": medusa.init_params(3, target.n_embd),
        "eagle": eagle_grad.init_params(target.n_embd, np.random.default_rng(0), std=0.2),
    }
    for kind, p in params.items():
        save_heads(folder / kind, kind, target, p, {"n_heads": 3 if kind == "medusa" else 1}, vocab)
    return {kind: f"{kind}:{folder / kind}" for kind in params}


def every_drafter(target, folder, corpus) -> list:
    from specdec.drafters.restricted import restrict

    heads = write_untrained_heads(folder, target, np.unique(corpus))
    return [
        ("ngram", None),
        ("early_exit:1", None),
        ("ngram", 6),
        (heads["medusa"], None),
        (heads["medusa"], 6),
        (heads["eagle"], None),
        (heads["eagle"], 6),
        (restrict(target, 64, corpus), None),
        (restrict(target, 64, corpus), 5),
    ]


def test_every_drafter_runs_on_a_tiny_llama(tiny, tmp_path):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = autoregressive_sample(tiny, prompt, 20).tokens
    for draft, tree in every_drafter(tiny, tmp_path, np.arange(0, tiny.n_vocab, 2)):
        out = speculative_sample(tiny, draft, prompt, 20, K=3, tree=tree)
        assert out.tokens == plain, (draft, tree)
        assert sum(out.k_per_round) > 0 or draft == "ngram", (draft, tree)  # it drafted: drafts were judged


@pytest.mark.slow
def test_every_drafter_runs_on_smollm2(smollm2, tmp_path):
    text = "Repeat exactly: the quick brown fox jumps over the lazy dog."
    prompt = chat_prompt(smollm2.tokenizer, text)
    plain = autoregressive_sample(smollm2, prompt, 16).tokens
    for draft, tree in every_drafter(smollm2, tmp_path, prompt + plain):
        if draft == "early_exit:1":
            draft = "early_exit:24"
        assert speculative_sample(smollm2, draft, prompt, 16, K=3, tree=tree).tokens == plain, (draft, tree)
