"""The forward pass: reference logits, KV cache equivalence, masking, dtypes."""

import numpy as np
import pytest
from conftest import FIXTURES, TINY_HPARAMS, tiny_model

from specdec.model.linear import Linear
from specdec.checkpoints.load import load_folder
from specdec.model.attention import KVCache
from specdec.model.attention import softmax
from specdec.model.gpt2 import HParams, gelu, layer_norm

ATOL = 2e-5  # float32 accumulation differences between one call and many


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1)


def test_matches_huggingface_transformers_logits():
    """Logits of GPT2LMHeadModel (transformers), committed by tests/fixtures/make_reference.py."""
    hf = load_folder(FIXTURES / "tiny-gpt2", with_tokenizer=False)
    ref = np.load(FIXTURES / "tiny_gpt2_reference.npz", allow_pickle=False)
    n_cases = sum(1 for k in ref.files if k.startswith("tokens_"))
    assert n_cases >= 4
    for i in range(n_cases):
        logits = hf(ref[f"tokens_{i}"])
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits, ref[f"logits_{i}"], atol=1e-4, rtol=0)


def test_greedy_matches_huggingface_generate():
    hf = load_folder(FIXTURES / "tiny-gpt2", with_tokenizer=False)
    ref = np.load(FIXTURES / "tiny_gpt2_reference.npz", allow_pickle=False)
    ids = list(ref["greedy_prompt"])
    cache = hf.new_cache()
    logits = hf.forward(ids, cache, last_only=True)
    out = []
    for _ in range(len(ref["greedy_tokens"])):
        out.append(int(logits[-1].argmax()))
        logits = hf.forward([out[-1]], cache, last_only=True)
    assert out == list(ref["greedy_tokens"])


def test_cached_token_by_token_equals_cache_free(model):
    tokens = np.random.default_rng(0).integers(0, model.n_vocab, size=20)
    full = model(tokens)
    cache = model.new_cache()
    stepwise = np.concatenate([model.forward(tokens[i : i + 1], cache) for i in range(len(tokens))])
    assert cache.length == len(tokens)
    np.testing.assert_allclose(stepwise, full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("chunks", [[3, 1, 5, 2, 9], [1, 19], [7, 7, 6], [20]])
def test_cached_chunks_equal_cache_free(model, chunks):
    """m new tokens after n cached: row i must see the cache and new tokens 0..i only."""
    tokens = np.random.default_rng(1).integers(0, model.n_vocab, size=sum(chunks))
    full = model(tokens)
    cache, rows, start = model.new_cache(), [], 0
    for size in chunks:
        rows.append(model.forward(tokens[start : start + size], cache))
        start += size
    np.testing.assert_allclose(np.concatenate(rows), full, atol=ATOL, rtol=0)


def test_cache_growth_keeps_what_is_cached(model):
    tokens = np.random.default_rng(4).integers(0, model.n_vocab, size=40)
    cache = KVCache(model.hparams, reserve=1)  # grows 1 -> 2 -> 4 -> ... -> 64
    rows = [model.forward(tokens[i : i + 3], cache) for i in range(0, 39, 3)] + [model.forward(tokens[39:], cache)]
    assert cache.k.shape[2] >= 40 and cache.length == 40
    np.testing.assert_allclose(np.concatenate(rows), model(tokens), atol=ATOL, rtol=0)


def test_rollback_then_continue_equals_fresh_run(model):
    rng = np.random.default_rng(2)
    prefix = rng.integers(0, model.n_vocab, size=8)
    rejected = rng.integers(0, model.n_vocab, size=5)
    accepted = rng.integers(0, model.n_vocab, size=4)
    cache = model.new_cache()
    model.forward(prefix, cache)
    model.forward(rejected, cache)  # a draft that will be thrown away
    cache.rollback(len(prefix))
    after = model.forward(accepted, cache)
    expected = model(np.concatenate([prefix, accepted]))[len(prefix) :]
    np.testing.assert_allclose(after, expected, atol=ATOL, rtol=0)
    # And the cache itself now equals one built from the accepted text alone.
    fresh = model.new_cache()
    model.forward(np.concatenate([prefix, accepted]), fresh)
    n = fresh.length
    assert cache.length == n
    np.testing.assert_allclose(cache.k[:, :, :n], fresh.k[:, :, :n], atol=ATOL)
    np.testing.assert_allclose(cache.v[:, :, :n], fresh.v[:, :, :n], atol=ATOL)


def test_future_tokens_do_not_change_earlier_logits(model):
    """Causality: changing token j leaves rows < j untouched, and does change row j."""
    tokens = np.random.default_rng(3).integers(0, model.n_vocab, size=12)
    changed = tokens.copy()
    changed[7] = (changed[7] + 1) % model.n_vocab
    a, b = model(tokens), model(changed)
    np.testing.assert_array_equal(a[:7], b[:7])
    assert np.abs(a[7] - b[7]).max() > 1e-3


def test_last_only_returns_the_last_row(model):
    tokens = [5, 6, 7, 8]
    last = model.forward(tokens, model.new_cache(), last_only=True)
    assert last.shape == (1, model.n_vocab)
    np.testing.assert_allclose(last[0], model(tokens)[-1], atol=ATOL, rtol=0)


def test_return_hidden_gives_the_rows_the_lm_head_reads(model):
    tokens = [3, 1, 4, 1, 5]
    logits = model.forward(tokens, model.new_cache())
    both, hidden = model.forward(tokens, model.new_cache(), return_hidden=True)
    assert hidden.shape == (5, model.n_embd) and hidden.dtype == np.float32
    np.testing.assert_array_equal(both, logits)
    np.testing.assert_allclose(hidden @ model.weights.wte.T, logits, atol=ATOL)  # after ln_f: tied LM head
    last, all_hidden = model.forward(tokens, model.new_cache(), last_only=True, return_hidden=True)
    assert last.shape == (1, model.n_vocab) and all_hidden.shape == (5, model.n_embd)  # every row's hidden
    np.testing.assert_allclose(last, logits[-1:], atol=ATOL)
    np.testing.assert_allclose(all_hidden, hidden, atol=ATOL)


def test_float32_end_to_end(model):
    cache = model.new_cache()
    logits = model.forward([1, 2, 3], cache)
    assert logits.dtype == np.float32
    assert cache.k.dtype == cache.v.dtype == np.float32
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(2, 6)
    assert gelu(x).dtype == np.float32
    assert softmax(x).dtype == np.float32
    g, b = np.ones(6, np.float32), np.zeros(6, np.float32)
    assert layer_norm(x, g, b, 1e-5).dtype == np.float32


def test_gelu_and_layer_norm_values():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0], dtype=np.float32)
    # tanh-approximate GELU, computed independently in float64.
    x64 = x.astype(np.float64)
    expected = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    np.testing.assert_allclose(gelu(x), expected, atol=1e-6)
    y = layer_norm(x[None], np.full(5, 2.0, np.float32), np.full(5, 1.0, np.float32), 1e-5)
    np.testing.assert_allclose(y.mean(), 1.0, atol=1e-5)
    np.testing.assert_allclose(y.std(), 2.0, atol=1e-3)


def test_early_exit_uses_only_the_first_layers(model):
    """n_layer=L must equal a model truncated to its first L blocks."""
    from specdec.model.gpt2 import GPT2, Weights

    w = model.weights
    truncated = GPT2(
        HParams(model.n_vocab, model.n_ctx, model.n_embd, model.n_head, 1),
        Weights(w.wte, w.wpe, w.blocks[:1], w.ln_f_weight, w.ln_f_bias),
    )
    tokens = [3, 1, 4, 1, 5]
    early = model.forward(tokens, model.new_cache(), n_layer=1)
    np.testing.assert_allclose(early, truncated(tokens), atol=ATOL, rtol=0)
    assert np.abs(early - model(tokens)).max() > 1e-3


def test_bad_inputs_are_clear_errors(model):
    with pytest.raises(ValueError, match="1..64 tokens"):
        model(np.zeros(65, dtype=int))
    with pytest.raises(ValueError, match="token ids"):
        model([model.n_vocab])
    cache = model.new_cache(capacity=4)
    model.forward([1, 2, 3], cache)
    with pytest.raises(ValueError, match="exceed the cache capacity"):
        model.forward([1, 2], cache)
    with pytest.raises(ValueError, match="n_layer"):
        model.forward([1], model.new_cache(), n_layer=3)
    with pytest.raises(ValueError, match="divisible"):
        HParams(n_vocab=10, n_ctx=8, n_embd=30, n_head=4, n_layer=1)
    with pytest.raises(AssertionError):
        KVCache(TINY_HPARAMS).rollback(1)


def test_chunked_multi_token_linear_matches_plain_matmul(monkeypatch):
    """The stacked matrix-vector path (2..16 tokens), with several chunks and leftover rows."""
    import specdec.model.fast.kernels as kernels

    monkeypatch.setattr(kernels, "CHUNK_BYTES", 4096)  # 48 inputs x 4 bytes: 21 rows per chunk
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((48, 1000), dtype=np.float32)
    b = rng.standard_normal(1000, dtype=np.float32)
    lin = Linear.from_checkpoint(w, b)
    part = kernels.split(lin).parts[0]
    n_chunks, _, chunk, _ = part.chunks.shape
    assert n_chunks > 1 and n_chunks * chunk < part.stop - part.start, "the test must exercise chunks and leftover rows"
    for n_seq in range(1, 20):
        x = rng.standard_normal((n_seq, 48), dtype=np.float32)
        y = kernels.linear(x, lin)
        assert y.dtype == np.float32 and y.shape == (n_seq, 1000)
        np.testing.assert_allclose(y, x.astype(np.float64) @ w + b, atol=1e-4, rtol=1e-5)


def test_cache_equivalence_through_the_chunked_path(monkeypatch):
    """The KV-cache equivalence again, with every matrix taking the chunked path."""
    import specdec.model.fast.kernels as kernels

    monkeypatch.setattr(kernels, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    model = tiny_model(seed=8)  # built after the patch: its Linears are chunked
    assert kernels.split(model.weights.blocks[0].mlp_c_fc).parts[0].chunks.shape[0] > 1
    tokens = np.random.default_rng(9).integers(0, model.n_vocab, size=17)
    cache, rows = model.new_cache(), []
    for start, stop in ((0, 5), (5, 6), (6, 14), (14, 17)):
        rows.append(model.forward(tokens[start:stop], cache))
    monkeypatch.setattr(kernels, "MAX_CHUNKED_ROWS", 0)  # reference: plain matmul everywhere
    np.testing.assert_allclose(np.concatenate(rows), model(tokens), atol=ATOL, rtol=0)
