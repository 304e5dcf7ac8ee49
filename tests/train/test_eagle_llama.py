"""EAGLE heads with a Llama block (train/eagle_llama.py, drafters/eagle.py): gradients against finite
differences in float64 (EAGLE's loss, and EAGLE-3's with its training-time test), drafting against the
training forward, head files, greedy equivalence and exact sampling on tiny random Llamas."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import LyingQ, assert_grads_match, chi_square_passes, exact_continuations, sample_many

from specdec import autoregressive_sample, speculative_sample
from specdec.drafters.eagle import EagleDrafter, LlamaEagleModel, llama_param_shapes
from specdec.drafters.heads import DraftVocab, HeadFileError, save_heads, target_distributions
from specdec.model.llama import LlamaHParams, random_llama
from specdec.sampling import SamplingParams
from specdec.train import eagle_llama as el
from specdec.train.features import layer_states
from specdec.train.heads_train import HeadBatch
from specdec.train.optim import AdamW

F32 = np.float32
TINY = LlamaHParams(n_vocab=64, n_ctx=128, n_embd=32, n_head=4, n_kv_head=2, n_layer=4, n_ff=48)
SMOLLM2 = LlamaHParams(
    n_vocab=49152, n_ctx=8192, n_embd=576, n_head=9, n_kv_head=3, n_layer=30, n_ff=1536, rope_theta=100000.0
)


def head_batch(target, vocab: DraftVocab, rows: list[list[int]], n_prompt: int, layers: list[int]):
    """A HeadBatch (as rows.make_batch makes from shards) of these rows: states of `layers`, labels after the prompt.

    Label position t (token t + 1 is a reply token): the target's distribution there on the draft vocabulary.
    """
    B, T = len(rows), max(map(len, rows))
    tokens, lengths = np.zeros((B, T), np.int64), np.array([len(r) for r in rows])
    states = np.zeros((len(layers) + 1, B, T, target.n_embd), target.dtype)
    label_mask = np.zeros((B, T), bool)
    for b, (row, s) in enumerate(zip(rows, layer_states(target, [r[:-1] for r in rows], [*layers, target.n_layer]))):
        tokens[b, : len(row)] = row
        states[:, b, : len(row) - 1] = s
        label_mask[b, n_prompt - 1 : len(row) - 1] = True
    p = target_distributions(states[-1][label_mask], vocab, target)  # [n, N]
    next_ids = tokens[:, 1:][label_mask[:, :-1]]
    return HeadBatch(tokens, states[:-1], lengths, label_mask, p, next_ids, np.zeros(len(next_ids), np.int64))


def float64_problem(block: str, restricted: bool, seed=0):
    target = random_llama(TINY, seed=seed, scale=0.3).astype(np.float64)
    rng = np.random.default_rng(seed)
    vocab = DraftVocab.of(target, np.arange(0, 64, 3) if restricted else None)
    params = {k: v.astype(np.float64) for k, v in el.init_params(target, block, rng, std=0.3).items()}
    for value in params.values():  # gains away from 1
        if value.ndim == 1:
            value += rng.standard_normal(value.shape) * 0.3
    rows = [list(rng.integers(0, 64, 9)), list(rng.integers(0, 64, 6))]  # the second row padded
    return target, vocab, params, head_batch(target, vocab, rows, 3, el.LlamaEagleKind(block).layers(target))


@pytest.mark.parametrize("restricted", [False, True])
def test_eagle_llama_gradients_of_every_parameter(restricted):
    target, vocab, params, batch = float64_problem("llama", restricted)
    loss, parts, grads = el.eagle_loss_and_grads(params, target, vocab, batch)
    assert sorted(grads) == sorted(params) and set(parts) == {"feat", "ce"}
    logits, rows = el.eagle_logits(params, target, vocab, batch)
    assert len(logits) == rows.sum() == batch.label_mask[:, 1:].sum() and len(rows) == batch.n_labels
    assert_grads_match(lambda: el.eagle_loss_and_grads(params, target, vocab, batch)[0], params, grads, n=5)


@pytest.mark.parametrize("restricted", [False, True])
def test_eagle3_gradients_of_every_parameter_through_both_steps(restricted):
    target, vocab, params, batch = float64_problem("eagle3", restricted, seed=1)
    loss, parts, grads = el.eagle3_loss_and_grads(params, target, vocab, batch)
    assert sorted(grads) == sorted(params) and set(parts) == {"ce0", "ce1"}
    assert_grads_match(lambda: el.eagle3_loss_and_grads(params, target, vocab, batch)[0], params, grads, n=5)


@pytest.mark.parametrize("restricted", [False, True])
def test_llama_block_with_the_training_time_test_gradients_through_both_steps(restricted):
    """--ttt: EAGLE's loss at step 0 and again at step 1, which reads the head's own outputs."""
    target, vocab, params, batch = float64_problem("llama", restricted, seed=2)
    loss, parts, grads = el.eagle_loss_and_grads(params, target, vocab, batch, ttt=True)
    assert sorted(grads) == sorted(params) and set(parts) == {"feat", "ce", "feat1", "ce1"}
    assert parts["feat1"] > 0 and parts["ce1"] > 0
    plain, plain_parts, _ = el.eagle_loss_and_grads(params, target, vocab, batch)
    assert plain_parts == {"feat": parts["feat"], "ce": parts["ce"]}  # step 0 is the plain loss
    assert loss == pytest.approx(plain + el.STEP_WEIGHTS[1] * (parts["feat1"] + 0.1 * parts["ce1"]))
    assert_grads_match(lambda: el.eagle_loss_and_grads(params, target, vocab, batch, ttt=True)[0], params, grads, n=5)


def test_the_training_time_test_scores_step_1_against_the_next_true_feature_and_token():
    """Step 1's pair j (y_j, x_(j+2)) at position j + 1 stands for f_(j+2) and predicts x_(j+3): its loss, recomputed
    here from the unrolled outputs pair by pair, is the one --ttt trains on."""
    from specdec.drafters.heads import cross_entropy, smooth_l1

    target, vocab, params, batch = float64_problem("llama", False, seed=2)
    _, parts, _ = el.eagle_loss_and_grads(params, target, vocab, batch, ttt=True)
    f, emb, positions, mask = el.pairs(target, batch, 1)
    _, y1, _, _ = el.unrolled_forward(params, f, emb, positions, mask, el.head_hparams(target))
    outs, wants = [], []
    for b, n in enumerate(batch.lengths):  # states f_0 .. f_(n-2) are real; f_(j+2) exists for j <= n - 4
        for j in range(n - 3):
            outs.append(y1[b, j])
            wants.append(batch.states[0][b, j + 2])
    assert parts["feat1"] == pytest.approx(smooth_l1(np.array(outs), np.array(wants))[0])
    # labels: the p rows of label positions j + 2 (batch.p runs row-major over batch.label_mask)
    label_rows, outs = [], []
    row = 0
    for b in range(len(batch.lengths)):
        for t in np.flatnonzero(batch.label_mask[b]):
            if t >= 2:
                outs.append(y1[b, t - 2])
                label_rows.append(row)
            row += 1
    assert parts["ce1"] == pytest.approx(cross_entropy(vocab.logits(np.array(outs)), batch.p[label_rows])[0])


@pytest.mark.parametrize("block", ["eagle3", "llama"])
def test_the_unrolled_check_sees_step_1_cut_off_from_step_0(block, monkeypatch):
    """BROKEN: step 1's gradient not passed back into step 0's output y (the feed-back treated as data)."""
    target, vocab, params, batch = float64_problem(block, False, seed=1)
    kind = el.LlamaEagleKind(block, ttt=block == "llama")
    real = el.head_backward
    calls = []

    def cut(dy, params, saved, h, grads=None):
        dg, grads = real(dy, params, saved, h, grads)
        calls.append(1)
        if len(calls) == 1:  # the step-1 pass: drop what flows into y
            dg = dg.copy()
            dg[:, dg.shape[1] // 2 :] = 0
        return dg, grads

    monkeypatch.setattr(el, "head_backward", cut)
    _, _, grads = kind.loss_and_grads(params, target, None, vocab, batch)
    monkeypatch.undo()
    assert calls, "the broken backward was never called"
    with pytest.raises(AssertionError):
        assert_grads_match(lambda: kind.loss_and_grads(params, target, None, vocab, batch)[0], params, grads, n=5)


def test_ttt_mask_is_causal_over_step_0_and_diagonal_over_step_1():
    mask = el.ttt_mask(np.tri(3, dtype=bool)[None])[0].astype(int)
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ]


@pytest.mark.parametrize("block", ["llama", "eagle3"])
def test_drafting_forward_equals_the_training_forward(block):
    """Pairs through model.llama's inference block with a KV cache (several, then one at a time) == teacher-forced."""
    target = random_llama(TINY, seed=2, scale=0.3)
    rng = np.random.default_rng(3)
    params = el.init_params(target, block, rng, std=0.2)
    T = 6
    g = rng.standard_normal((1, T, TINY.n_embd)).astype(F32)
    emb = rng.standard_normal((1, T, TINY.n_embd)).astype(F32)
    y_train, _ = el.head_forward(params, g, emb, np.arange(T)[None], np.tri(T, dtype=bool)[None], TINY)
    model = LlamaEagleModel(params, TINY, block, n_ctx=64)
    cache = model.new_cache()
    y_draft = np.concatenate(
        [model.step(g[0, :2], emb[0, :2], cache)]
        + [model.step(g[0, j : j + 1], emb[0, j : j + 1], cache) for j in range(2, T)]
    )
    assert y_train.dtype == y_draft.dtype == F32
    np.testing.assert_allclose(y_draft, y_train[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block", ["llama", "eagle3"])
def test_a_smollm2_head_file_is_under_10_mb_in_float16(block):
    """fc, one SmolLM2-shaped block (and EAGLE-3's fuse, norm): the LM head is the target's, not stored."""
    n = sum(int(np.prod(s)) for s in llama_param_shapes(SMOLLM2, block).values())
    assert n * 2 <= 10 * 2**20, f"{n * 2 / 2**20:.1f} MiB"


# --- drafting: a briefly trained head on a tiny Llama ------------------------------------------------


def train_briefly(target, block: str, steps=60, seed=0):
    """A few hundred AdamW steps on the target's own greedy and sampled text, so drafts get accepted."""
    rng = np.random.default_rng(seed)
    vocab = DraftVocab.of(target)
    rows = []
    for i in range(12):
        prompt = [int(t) for t in rng.integers(0, TINY.n_vocab, 3)]
        rows.append(prompt + autoregressive_sample(target, prompt, 21, temperature=i % 2, seed=i).tokens)
    batch = head_batch(target, vocab, rows, 3, el.LlamaEagleKind(block).layers(target))
    params = el.init_params(target, block, rng)
    opt = AdamW(params, lr=1e-2)
    loss_and_grads = el.eagle_loss_and_grads if block == "llama" else el.eagle3_loss_and_grads
    first = None
    for _ in range(steps):
        loss, _, grads = loss_and_grads(params, target, vocab, batch)
        first = loss if first is None else first
        opt.step(grads)
    assert loss < first
    return params


@pytest.fixture(scope="module")
def llama_target():
    return random_llama(TINY, seed=5, scale=0.5)


@pytest.fixture(scope="module")
def trained_head(llama_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle-llama")
    params = train_briefly(llama_target, "llama")
    save_heads(folder, "eagle", llama_target, params, {"n_heads": 1, "block": "llama"}, DraftVocab.of(llama_target))
    return folder


def test_the_head_file_records_its_block_and_loads_through_the_checked_loader(llama_target, trained_head, tmp_path):
    drafter = EagleDrafter.load(trained_head, llama_target)
    assert isinstance(drafter.model, LlamaEagleModel)
    with pytest.raises(HeadFileError, match="for a Llama target"):  # a GPT-2 target cannot run a Llama-block head
        from conftest import tiny_model

        EagleDrafter.load(trained_head, tiny_model())
    bad = tmp_path / "bad"
    save_heads(
        bad,
        "eagle",
        llama_target,
        {"fc": np.zeros((32, 64), F32)},
        {"n_heads": 1, "block": "llama"},
        DraftVocab.of(llama_target),
    )
    with pytest.raises(HeadFileError, match="missing"):
        EagleDrafter.load(bad, llama_target)
    save_heads(
        bad,
        "eagle",
        llama_target,
        {"fc": np.zeros((32, 64), F32)},
        {"n_heads": 1, "block": "rnn"},
        DraftVocab.of(llama_target),
    )
    with pytest.raises(HeadFileError, match="'block' is 'rnn'"):
        EagleDrafter.load(bad, llama_target)


@pytest.mark.parametrize(
    "change,says",
    [
        ({"rope_theta": float("nan")}, "'rope_theta' is nan"),  # written as JSON's NaN
        ({"rope_theta": 20000.0}, "'rope_theta' is 20000.0, but the target 'random-llama' has rope_theta=10000.0"),
        ({"n_kv_head": 4}, "'n_kv_head' is 4, but the target 'random-llama' has n_kv_head=2"),
        ({"n_kv_head": True}, "'n_kv_head' is True"),
        ({"n_ff": 2**63}, "'n_ff' is 9223372036854775808"),
        ({"n_ff": None}, "'n_ff' is None"),
        ({"layers": [99]}, "'layers' must list the 1 target layer"),
        ({"layers": "4"}, "'layers' must list"),
    ],
)
def test_a_llama_heads_numbers_must_be_the_targets(llama_target, trained_head, tmp_path, change, says):
    """A Llama-block head computes with the target's heads, MLP width and rotary base: a heads.json that says
    other numbers (a NaN rope_theta, another head count) is refused in one line, not loaded silently."""
    import json
    import shutil

    folder = tmp_path / "head"
    shutil.copytree(trained_head, folder)
    config = json.loads((folder / "heads.json").read_text())
    config.update({k: v for k, v in change.items() if v is not None})
    for k in [k for k, v in change.items() if v is None]:
        config.pop(k)
    (folder / "heads.json").write_text(json.dumps(config))
    with pytest.raises(HeadFileError, match=re.escape(says)) as e:
        EagleDrafter.load(folder, llama_target)
    assert "\n" not in str(e.value) and str(folder / "heads.json") in str(e.value)


def test_a_llama_heads_weights_linked_to_a_special_file_are_refused_at_once(llama_target, trained_head, tmp_path):
    import shutil
    import threading

    for target in ("/proc/self/pagemap", "/dev/zero"):
        folder = tmp_path / target.replace("/", "-")
        shutil.copytree(trained_head, folder)
        (weights,) = folder.glob("heads-*.safetensors")
        weights.unlink()
        weights.symlink_to(target)
        caught = []

        def load(folder=folder):
            with pytest.raises(HeadFileError) as e:
                EagleDrafter.load(folder, llama_target)
            caught.append(str(e.value))

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), f"a weights file linked to {target} hangs the load"
        assert caught and weights.name in caught[0] and "\n" not in caught[0], caught


@pytest.mark.parametrize("restricted", [False, True])
def test_greedy_speculative_with_a_llama_head_equals_greedy_autoregressive(llama_target, trained_head, restricted):
    drafter = EagleDrafter.load(trained_head, llama_target)
    if restricted:  # the same head, scoring only 32 tokens
        drafter.vocab = DraftVocab.of(llama_target, np.arange(0, 64, 2))
    accepted = 0
    for prompt in ([7, 5, 9], [7], [1, 40, 41, 42, 43]):
        expected = autoregressive_sample(llama_target, prompt, 30).tokens
        for nodes in (None, 8):  # a chain of 3, and EAGLE-2's dynamic tree of 8 nodes
            got = speculative_sample(llama_target, drafter, prompt, 30, K=3, tree=nodes)
            assert got.tokens == expected, (prompt, nodes)
            accepted += got.accepted
    assert accepted > 0


def test_tree_nodes_sit_at_their_depth_not_their_slot(llama_target, trained_head):
    """Each tree node is fed at rotary position committed + depth (where a chain would put it), not at its slot."""
    drafter = EagleDrafter.load(trained_head, llama_target)
    prompt = [7, 3, 4, 9]
    _, hidden = llama_target.forward(prompt[:-1], llama_target.new_cache(), return_hidden=True)
    drafter.begin(llama_target, None, prompt)
    drafter.commit(prompt, hidden)
    committed, fed = drafter.cache.length, []
    real_step = drafter.model.step

    def step(f, emb, cache, seen=None, positions=None):
        fed.extend(cache.length + np.arange(len(f)) if positions is None else positions)  # None: the cache slots
        return real_step(f, emb, cache, seen, positions)

    drafter.model.step = step
    tree = drafter.propose(prompt, 4, SamplingParams(1.0), np.random.default_rng(0), nodes=24)
    depth = []
    for parent in tree.parents:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    assert fed == [committed + d for d in depth[: len(fed)]]
    assert max(depth[: len(fed)]) >= 1 and len(set(depth[: len(fed)])) < len(fed)  # nodes of several depths, shared


# --- exact sampling at T=1, with a broken control ------------------------------------------------


SMALL_LLAMA = LlamaHParams(n_vocab=6, n_ctx=16, n_embd=16, n_head=4, n_kv_head=2, n_layer=1, n_ff=24)


class FlatQ(LyingQ):
    """BROKEN: proposes what the inner drafter drew, but reports q uniform over the draft vocabulary."""

    def misreport(self, q):
        return (q > 0).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["llama", "eagle3"])
@pytest.mark.parametrize("nodes", [None, 4], ids=["chain", "tree"])
def test_sampling_with_a_llama_head_keeps_the_target_distribution(block, nodes):
    target = random_llama(SMALL_LLAMA, seed=10, scale=0.6)
    params = el.init_params(target, block, np.random.default_rng(0), std=0.1)  # q far from one-hot
    layers = el.LlamaEagleKind(block).layers(target) if block == "eagle3" else None
    exact = exact_continuations(target, [1, 2], 3, SamplingParams(1.0))

    def drafter():
        return EagleDrafter(
            LlamaEagleModel(params, target.hparams, block, target.n_ctx),
            DraftVocab.of(target, [0, 2, 3, 5]),
            target.weights.wte,
            hidden_layers=layers,
        )

    good, broken = drafter(), FlatQ(drafter())

    def run(d):
        return lambda rng: speculative_sample(target, d, [1, 2], 3, K=2, temperature=1.0, rng=rng, tree=nodes)

    assert run(good)(np.random.default_rng(0)).drafted > 0
    ok, stat, df = chi_square_passes(sample_many(run(good), n_samples=6000), exact)
    assert ok, f"chi2={stat:.1f} df={df}"
    ok, stat, df = chi_square_passes(sample_many(run(broken), n_samples=2000), exact)
    assert not ok, f"a drafter misreporting q passed (chi2={stat:.1f}, df={df})"


# --- EAGLE-3 drafting: the target's low, middle and high states through the round ---------------


def test_a_pass_returns_the_layers_asked_for_side_by_side(llama_target, monkeypatch):
    """return_hidden=[layers]: the states features.layer_states computes, in one pass, chunked or not."""
    from specdec.model import base

    tokens = [3, 9, 27, 1, 5, 8, 13]
    layers = [2, 1, TINY.n_layer, 0]
    want = layer_states(llama_target, [tokens], layers)[0]  # [4, n, e]
    logits, hidden = llama_target.forward(tokens, llama_target.new_cache(), return_hidden=layers)
    np.testing.assert_allclose(hidden, np.concatenate(list(want), axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits, llama_target(tokens), rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(base, "PREFILL_CHUNK", 3)  # a long prompt's passes of 3 tokens
    _, chunked = llama_target.forward(tokens, llama_target.new_cache(), return_hidden=layers)
    np.testing.assert_allclose(chunked, hidden, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="layers 0..4"):
        llama_target.forward(tokens, llama_target.new_cache(), return_hidden=[5])


@pytest.fixture(scope="module")
def trained_eagle3(llama_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle3")
    kind = el.LlamaEagleKind("eagle3")
    params = train_briefly(llama_target, "eagle3", steps=25)
    save_heads(folder, "eagle", llama_target, params, kind.config(llama_target, {}), DraftVocab.of(llama_target))
    return folder


def test_eagle3_drafting_feeds_back_its_output_as_training_step_1_did(llama_target, trained_eagle3):
    """The drafter's pair (its own output y_j, x_(j+2)) after committing 0..j == the training-time test's step 1."""
    drafter = EagleDrafter.load(trained_eagle3, llama_target)
    assert drafter.hidden_layers == el.LlamaEagleKind("eagle3").layers(llama_target)
    rows = [[7, 3, 4, 9, 11, 2, 30, 8]]
    batch = head_batch(llama_target, drafter.vocab, rows, 1, drafter.hidden_layers)
    params = load_params(trained_eagle3, llama_target)
    y, y1, _ = el.eagle3_forward(params, llama_target, batch)
    text = rows[0]
    for j in (2, 5):
        ids = text[: j + 2]  # the committed text: pairs 0..j
        _, hidden = llama_target.forward(ids[:-1], llama_target.new_cache(), return_hidden=drafter.hidden_layers)
        drafter.begin(llama_target, None, ids)
        drafter.commit(ids, hidden)
        np.testing.assert_allclose(drafter.root, y[0, j], rtol=1e-4, atol=1e-5)
        fed = drafter.model.step(drafter.root[None], llama_target.weights.wte[text[j + 2]][None], drafter.cache)[0]
        np.testing.assert_allclose(fed, y1[0, j], rtol=1e-4, atol=1e-5)


def test_a_llama_heads_second_draft_token_is_the_unrolled_step_1(llama_target, trained_head):
    """Held-out "top1_second" scores what drafting does: the drafter's second token reads the head's own first
    output, which is unrolled_forward's step 1 (two_step_logits); its step 0 is the teacher-forced logits."""
    drafter = EagleDrafter.load(trained_head, llama_target)
    rows = [[7, 3, 4, 9, 11, 2, 30, 8]]
    kind = el.LlamaEagleKind("llama")
    batch = head_batch(llama_target, drafter.vocab, rows, 1, kind.layers(llama_target))
    params = load_params(trained_head, llama_target)
    (first, first_rows), (logits, which) = kind.two_logits(params, llama_target, None, drafter.vocab, batch)
    assert len(logits) == which.sum() == batch.label_mask[:, 2:].sum()
    forced, forced_rows = kind.logits(params, llama_target, None, drafter.vocab, batch)  # a pass of its own
    np.testing.assert_array_equal(first_rows, forced_rows)
    np.testing.assert_array_equal(first, forced)  # the same pass: the same numbers
    text = rows[0]
    for j in (2, 4):
        ids = text[: j + 2]
        _, hidden = llama_target.forward(ids[:-1], llama_target.new_cache(), return_hidden=True)
        drafter.begin(llama_target, None, ids)
        drafter.commit(ids, hidden)
        fed = drafter.model.step(drafter.root[None], llama_target.weights.wte[text[j + 2]][None], drafter.cache)[0]
        # label rows run over label positions 1.. here; step 1's pair j predicts x_(j+3), label position j + 2
        np.testing.assert_allclose(drafter.vocab.logits(fed[None])[0], logits[j + 2 - 2], rtol=1e-4, atol=1e-4)


def load_params(folder, target):
    from specdec.drafters.eagle import head_shapes
    from specdec.drafters.heads import load_heads

    return load_heads(folder, "eagle", target, head_shapes(folder, target))[1]


def test_greedy_speculative_with_an_eagle3_head_equals_greedy_autoregressive(llama_target, trained_eagle3):
    from specdec import speculative_sample_batch

    drafter = EagleDrafter.load(trained_eagle3, llama_target)
    accepted = 0
    prompts = ([7, 5, 9], [7], [1, 40, 41, 42, 43])
    for prompt in prompts:
        expected = autoregressive_sample(llama_target, prompt, 30).tokens
        for nodes in (None, 8):
            got = speculative_sample(llama_target, drafter, prompt, 30, K=3, tree=nodes)
            assert got.tokens == expected, (prompt, nodes)
            accepted += got.accepted
    assert accepted > 0
    batched = speculative_sample_batch(llama_target, f"eagle:{trained_eagle3}", list(prompts), 30, K=3)
    assert [r.tokens for r in batched] == [autoregressive_sample(llama_target, p, 30).tokens for p in prompts]


# --- the trainer: python -m specdec.train eagle --block llama|eagle3 --data DIR -------------------


@pytest.mark.parametrize("block", ["llama", "eagle3", "llama-ttt"])
def test_the_trainer_trains_ships_and_drafts_with_a_llama_block(block, tmp_path, capsys, monkeypatch):
    import json

    import specdec.checkpoints.load as load
    from test_distill import POOL, SETTINGS, chat_model

    from specdec.train.cli import main
    from specdec.train.distill import make_data

    model = chat_model(scale=1.0)
    make_data(model, tmp_path / "data", 200, POOL, **{**SETTINGS, "max_reply": 16, "greedy_frac": 0.75})
    monkeypatch.setattr(load, "load_model", lambda name, progress=True: model)
    out = tmp_path / "head"
    ttt = block == "llama-ttt"
    args = [
        "eagle",
        "--model",
        "tiny",
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(out),
        "--block",
        block.removesuffix("-ttt"),
        "--vocab-top",
        "100",
        "--steps",
        "4",
        "--batch-tokens",
        "256",
        "--held-out",
        "0.3",
        "--quiet",
    ] + ["--ttt"] * ttt
    assert main(args) == 0, capsys.readouterr().err
    card = json.loads((out / "heads.json").read_text())
    assert card["kind"] == "eagle" and card["block"] == block.removesuffix("-ttt") and card["steps"] == 4
    assert card.get("training_time_test", False) is ttt
    assert 0 <= card["held_out"]["trained"]["top1_second"] <= 1
    assert json.loads((out / "checkpoint.json").read_text()).get("training_time_test", False) is ttt
    assert main(["ship", "--model", "tiny", "--head", str(out), "--out", str(tmp_path / "shipped")]) == 0
    card_text = (tmp_path / "shipped" / "CARD.txt").read_text()
    assert ("training-time test" in card_text) is ttt and "second draft token" in card_text
    prompt = model.tokenizer.encode("Hi there")
    expected = autoregressive_sample(model, prompt, 16).tokens
    for folder in (out, tmp_path / "shipped"):
        assert speculative_sample(model, f"eagle:{folder}", prompt, 16, K=3).tokens == expected


@pytest.mark.parametrize("block", ["gpt2", "eagle3"])
def test_the_trainer_refuses_ttt_but_for_a_llama_block_in_one_line(block, tmp_path, capsys, monkeypatch):
    import specdec.checkpoints.load as load

    from specdec.train.cli import main

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: random_llama(TINY, seed=0))
    (tmp_path / "data").mkdir()
    assert (
        main(
            [
                "eagle",
                "--model",
                "tiny",
                "--data",
                str(tmp_path / "data"),
                "--out",
                str(tmp_path / "o"),
                "--block",
                block,
                "--ttt",
                "--quiet",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ttt" in err and "--block llama" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_the_trainer_refuses_a_llama_block_for_a_gpt2_target_in_one_line(tmp_path, capsys, monkeypatch):
    import specdec.checkpoints.load as load
    from conftest import tiny_model

    from specdec.train.cli import main

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: tiny_model())
    (tmp_path / "data").mkdir()
    assert (
        main(
            [
                "eagle",
                "--model",
                "tiny",
                "--data",
                str(tmp_path / "data"),
                "--out",
                str(tmp_path / "o"),
                "--block",
                "llama",
                "--quiet",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a Llama target" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# --- EAGLE-3 started from a trained EAGLE head (--init-head) -------------------------------------


def test_fuse_fits_a_linear_map_exactly_and_finds_nothing_in_noise():
    rng = np.random.default_rng(0)
    fused = rng.standard_normal((4000, 24)).astype(F32)
    fused[:, 5] *= 40  # an outlier dimension, as residual streams have
    mapping = rng.standard_normal((8, 24)).astype(F32)
    fuse, r2 = el.fit_fuse(fused, fused @ mapping.T)
    assert r2 > 0.9999 and np.allclose(fuse, mapping, atol=2e-2)
    _, r2_noise = el.fit_fuse(fused, rng.standard_normal((4000, 8)).astype(F32))
    assert r2_noise < 0.02


def test_eagle3_from_eagle_keeps_the_heads_weights_and_scales_its_norm_to_the_features():
    rng = np.random.default_rng(1)
    target = random_llama(TINY, seed=1)
    eagle = el.init_params(target, "llama", rng)
    fused = rng.standard_normal((500, 96)).astype(F32)
    final = 3.0 * rng.standard_normal((500, 32)).astype(F32)
    params, _ = el.eagle3_from_eagle(eagle, fused, final)
    assert set(params) == set(llama_param_shapes(TINY, "eagle3"))
    assert all(np.array_equal(params[name], w) for name, w in eagle.items())
    rms = np.sqrt((final.astype(np.float64) ** 2).mean(-1))
    assert np.allclose(params["norm"], np.median(rms)) and 2.7 < params["norm"][0] < 3.3
    y = final[:4]  # an output of typical size: EAGLE-3's normed output is (nearly) EAGLE's own
    normed, _ = el.lg.rms_norm(y, params["norm"], TINY.rms_eps)
    assert np.allclose(normed, y * (np.median(rms) / np.sqrt((y**2).mean(-1, keepdims=True))), rtol=1e-4)


def _eagle_head_run(tmp_path, monkeypatch):
    """A tiny chat model, its distillation data, and an EAGLE head (block llama) trained on it by the CLI."""
    import specdec.checkpoints.load as load
    from test_distill import POOL, SETTINGS, chat_model

    from specdec.train.cli import main
    from specdec.train.distill import make_data

    model = chat_model(scale=1.0)
    make_data(model, tmp_path / "data", 200, POOL, **{**SETTINGS, "max_reply": 16, "greedy_frac": 0.75})
    monkeypatch.setattr(load, "load_model", lambda name, progress=True: model)
    common = [
        "--model",
        "tiny",
        "--data",
        str(tmp_path / "data"),
        "--vocab-top",
        "100",
        "--batch-tokens",
        "256",
        "--held-out",
        "0.3",
        "--quiet",
    ]
    assert (
        main(["eagle", *common, "--out", str(tmp_path / "eagle"), "--block", "llama", "--steps", "30", "--lr", "3e-3"])
        == 0
    )
    return model, main, common


def test_an_eagle3_head_starts_from_an_eagle_head_trains_ships_and_drafts(tmp_path, capsys, monkeypatch):
    import json

    model, main, common = _eagle_head_run(tmp_path, monkeypatch)
    eagle_card = json.loads((tmp_path / "eagle" / "heads.json").read_text())
    out = tmp_path / "eagle3"
    assert (
        main(
            [
                "eagle",
                *common,
                "--out",
                str(out),
                "--block",
                "eagle3",
                "--steps",
                "2",
                "--lr",
                "1e-4",
                "--init-head",
                str(tmp_path / "eagle"),
            ]
        )
        == 0
    ), capsys.readouterr().err
    card = json.loads((out / "heads.json").read_text())
    init = card["init"]
    assert card["block"] == "eagle3" and init["head"] == "eagle" and init["fit_positions"] > 100
    assert init["weights_sha256"] == eagle_card["weights_sha256"] and init["fuse_r2"] <= 1
    # The tiny model has 2 layers, so the fused layers include the final feature itself: fuse fits it exactly
    # (R^2 1) and the start ranks tokens as the EAGLE head does (its norm scales each output by a positive
    # number), on the same held-out rows; an untrained head (a copy that failed) ranks them at random.
    started, untrained = init["top1_top5"]["top1"], card["held_out"]["untrained"]["top1"]
    assert init["fuse_r2"] > 0.999 and started == pytest.approx(eagle_card["held_out"]["trained"]["top1"], abs=1e-9)
    assert started > untrained
    assert main(["ship", "--model", "tiny", "--head", str(out), "--out", str(tmp_path / "shipped")]) == 0
    assert "started from: the EAGLE head eagle (its fc and block" in (tmp_path / "shipped" / "CARD.txt").read_text()
    prompt = model.tokenizer.encode("Hi there")
    expected = autoregressive_sample(model, prompt, 16).tokens
    assert speculative_sample(model, f"eagle:{tmp_path / 'shipped'}", prompt, 16, K=3).tokens == expected


@pytest.mark.parametrize("case", ["llama block", "eagle3 head", "with --init", "no shipped head", "draft"])
def test_init_head_is_refused_in_one_line_before_anything_is_made(case, tmp_path, capsys, monkeypatch):
    model, main, common = _eagle_head_run(tmp_path, monkeypatch)
    if case == "eagle3 head":  # a head that is not EAGLE's with a Llama block
        assert main(["eagle", *common, "--out", str(tmp_path / "e3"), "--block", "eagle3", "--steps", "1"]) == 0
    capsys.readouterr()
    args = {
        "llama block": ["eagle", "--block", "llama", "--init-head", str(tmp_path / "eagle")],
        "eagle3 head": ["eagle", "--block", "eagle3", "--init-head", str(tmp_path / "e3")],
        "with --init": [
            "eagle",
            "--block",
            "eagle3",
            "--init-head",
            str(tmp_path / "eagle"),
            "--init",
            str(tmp_path / "eagle"),
        ],
        "no shipped head": ["eagle", "--block", "eagle3", "--init-head", "eagle"],
        "draft": ["draft", "--init-head", str(tmp_path / "eagle")],
    }[case]
    try:
        code = main([args[0], *common, "--out", str(tmp_path / "o"), *args[1:]])
    except SystemExit as e:  # refused by the argument parser
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert {
        "llama block": "--block eagle3",
        "eagle3 head": "its block is 'eagle3'",
        "with --init": "not with --init",
        "no shipped head": "no eagle head is shipped for",
        "draft": "--init-head only applies to eagle",
    }[case] in err, err
    assert not (tmp_path / "o").exists()
