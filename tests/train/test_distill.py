"""Distillation data at scale (specdec/train/distill.py, requests.py) on a tiny random chat Llama:
requests deterministic and kept apart from evaluation text, shards deterministic, resumable after a
crash, checked before trusted, labels equal to the model's softmax, greedy rows equal to greedy decoding."""

from __future__ import annotations

import fcntl
import json
import os

import numpy as np
import pytest

from specdec.autoregressive import autoregressive_sample
from specdec.bench.prompts import load_prompts
from specdec.model.llama import LlamaHParams, random_llama
from specdec.model.tokenizer import byte_decoder, gguf_encoding
from specdec.sampling import SamplingParams, probabilities
from specdec.train.cli import main
from specdec.train.distill import make_data
from specdec.train.shards import MANIFEST, load_distill_data, read_shard
from specdec.train.requests import (
    RequestPool,
    build_requests,
    eval_texts,
    overlap,
    split_list,
    stdlib_docs,
    templated_requests,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IM_END = 2
REQUESTS = [
    "Hi",
    "Tell me a joke.",
    "Why is the sky blue?",
    "Name a fruit.",
    "Count to three.",
    "Say yes.",
    "Write a haiku.",
    "What is 2+2?",
    "Define cat.",
    "Be brief.",
]


def chat_model(seed: int = 0, scale: float = 0.3):
    """A tiny Llama over a byte-level vocabulary with ChatML's control tokens (<|im_end|> = 2)."""
    alphabet = [ch for ch, _ in sorted(byte_decoder().items(), key=lambda kv: kv[1])]
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.tokens": SPECIALS + alphabet,
        "tokenizer.ggml.token_type": [3] * 3 + [1] * len(alphabet),
    }
    h = LlamaHParams(n_vocab=3 + 256, n_ctx=128, n_embd=32, n_head=4, n_kv_head=2, n_layer=2, n_ff=48)
    model = random_llama(h, seed=seed, scale=scale)
    model.tokenizer, model.name = gguf_encoding(metadata, "tiny.gguf"), "tiny-chat"
    # Make <|im_end|> likely enough that some replies end on their own.
    model.weights.wte[IM_END] *= 3
    return model


POOL = RequestPool(REQUESTS, len(REQUESTS), 0, [])
SETTINGS = dict(batch=3, max_reply=12, top_k=4, shard_rows=4, seed=5, system="S")


def shard_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("shard-*.npz"))}


# --- requests ------------------------------------------------------------------------------------


def test_requests_are_deterministic_from_the_seed_and_many():
    docs = [("function", "m.f", "Return the frobnicated value of x, for every x that can be frobnicated at all.")]
    a, b, c = build_requests(0, docs=docs), build_requests(0, docs=docs), build_requests(1, docs=docs)
    assert a.requests == b.requests and a.sha256 == b.sha256
    assert sorted(a.requests) == sorted(c.requests) and a.requests != c.requests  # same set, another order
    assert len(set(a.requests)) == len(a.requests) > 4000 and a.n_docs == 1
    assert any("m.f" in r for r in a.requests)


def test_list_items_may_wrap_onto_the_next_line():
    assert split_list("a b,\nc\nd, e,\n") == ["a b", "c d", "e"]
    assert "Write a Python function to find the largest element of a list." in templated_requests()
    assert not any(r.startswith("Write a Python function to of ") for r in templated_requests())


def test_docstrings_come_from_source_files_and_skip_held_out_and_private_ones(tmp_path):
    (tmp_path / "json").mkdir()
    doc = "Serialize an object to a JSON formatted string, with every option the encoder has."
    (tmp_path / "json" / "__init__.py").write_text(f'def dumps(obj):\n    """{doc}\n\n    More."""\n')
    (tmp_path / "_private.py").write_text(f'"""{doc}"""\n')
    (tmp_path / "codecs.py").write_text(f'"""{doc}"""\n')  # held out by the stdlib family's split
    (tmp_path / "short.py").write_text('"""Too short."""\n')
    assert stdlib_docs(tmp_path) == [("function", "json.dumps", doc)]


def test_overlap_check_catches_a_planted_suite_prompt_and_the_pool_has_none():
    suite_prompt = load_prompts()["lists"][0]
    planted = "PLEASE continue this:  " + suite_prompt.upper().replace(" ", "  ")  # case and spacing do not hide it
    found = overlap(REQUESTS + [planted], eval_texts())
    assert found and found.shared == [len(REQUESTS)]
    assert overlap([" ".join(suite_prompt.split()[:3])], [suite_prompt]).shared == []  # 3 words are not a copy
    pool = build_requests(0, docs=[("module", "m", planted)])
    assert len(pool.dropped) == 1 and pool.dropped[0].endswith(planted)
    assert not overlap(pool.requests, eval_texts())


# --- shards --------------------------------------------------------------------------------------


def test_data_is_deterministic_from_the_seed(tmp_path):
    model = chat_model()
    make_data(model, tmp_path / "a", 60, POOL, **SETTINGS)
    make_data(model, tmp_path / "b", 60, POOL, **SETTINGS)
    make_data(model, tmp_path / "c", 60, POOL, **{**SETTINGS, "seed": 6})
    a, b, c = (shard_bytes(tmp_path / x) for x in "abc")
    assert a == b and len(a) >= 2
    assert a != c
    data = load_distill_data(tmp_path / "a", model)
    assert data.n_tokens >= 60 and data.greedy.any() and not data.greedy.all()
    assert data.ended.any()  # some replies stop at <|im_end|> ...
    assert all(r[-1] == IM_END for r, e in zip(data.replies, data.ended) if e)
    assert all(len(r) == 12 for r, e in zip(data.replies, data.ended) if not e)  # ... the others at max_reply


def test_resuming_after_a_crash_gives_the_data_of_an_uninterrupted_run(tmp_path):
    model = chat_model()
    make_data(model, tmp_path / "whole", 60, POOL, **SETTINGS)
    cut = tmp_path / "cut"
    make_data(model, cut, 60, POOL, **SETTINGS, stop_after=1)  # then "kill -9" in the middle of shard 1:
    (cut / ".shard-00001.npz.x.tmp").write_bytes(b"half a shard")  # its temporary file left behind
    (cut / "shard-00002.npz").write_bytes(b"not in the manifest")  # a shard renamed but not yet recorded
    assert not json.loads((cut / MANIFEST).read_text())["complete"]
    make_data(model, cut, 60, POOL, **SETTINGS)
    assert shard_bytes(cut) == shard_bytes(tmp_path / "whole")
    assert json.loads((cut / MANIFEST).read_text())["complete"]


def test_a_run_killed_between_writing_a_shard_and_recording_it_resumes_to_the_same_data(tmp_path):
    """kill -9 at the worst moment: shard 1 renamed into place, the manifest not yet rewritten to name it."""
    import signal

    import specdec.train.distill as distill

    model = chat_model()
    make_data(model, tmp_path / "whole", 60, POOL, **SETTINGS)
    cut = tmp_path / "cut"
    pid = os.fork()
    if pid == 0:  # the child: a real process, killed by SIGKILL in the middle of the run
        real, calls = distill.write_manifest, []

        def write_manifest(folder, manifest):
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            real(folder, manifest)

        distill.write_manifest = write_manifest
        try:
            make_data(model, cut, 60, POOL, **SETTINGS)
        finally:
            os._exit(1)  # (only if it was not killed)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (cut / "shard-00001.npz").exists() and len(json.loads((cut / MANIFEST).read_text())["shards"]) == 1
    make_data(model, cut, 60, POOL, **SETTINGS)
    assert shard_bytes(cut) == shard_bytes(tmp_path / "whole")


def test_a_corrupted_shard_is_refused_by_the_loader_and_made_again_on_resume(tmp_path):
    model = chat_model()
    make_data(model, tmp_path, 30, POOL, **SETTINGS)
    good = shard_bytes(tmp_path)
    path = tmp_path / "shard-00000.npz"
    path.write_bytes(good[path.name][: len(good[path.name]) // 2])  # truncated
    with pytest.raises(ValueError, match="sha256"):
        load_distill_data(tmp_path)
    lines = []
    make_data(model, tmp_path, 30, POOL, **SETTINGS, log=lines.append)
    assert any("shard 0 is not trusted" in line for line in lines)
    assert shard_bytes(tmp_path) == good
    # A shard whose sha256 the manifest does record but whose contents are inconsistent is refused too.
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    with pytest.raises(ValueError, match="outside"):
        read_shard(tmp_path, manifest["shards"][0], n_vocab=10)


def test_another_model_or_other_settings_are_refused(tmp_path):
    make_data(chat_model(), tmp_path, 10, POOL, **SETTINGS)
    with pytest.raises(ValueError, match="other settings .*model_fingerprint"):
        make_data(chat_model(seed=1), tmp_path, 10, POOL, **SETTINGS)
    with pytest.raises(ValueError, match="max_reply differ"):
        make_data(chat_model(), tmp_path, 10, POOL, **{**SETTINGS, "max_reply": 5})
    with pytest.raises(ValueError, match="another model"):
        load_distill_data(tmp_path, chat_model(seed=1))
    with open(tmp_path / ".lock", "w") as lock:  # a run in progress holds the folder
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="being written by another run"):
            make_data(chat_model(), tmp_path, 10, POOL, **SETTINGS)


def test_top_k_labels_are_the_models_softmax_and_greedy_rows_are_greedy_decoding(tmp_path):
    model = chat_model()
    make_data(model, tmp_path, 60, POOL, **SETTINGS)
    data = load_distill_data(tmp_path, model)
    n_greedy = 0
    for prompt, reply, ids, probs, greedy in zip(data.prompts, data.replies, data.top_ids, data.top_probs, data.greedy):
        text = np.concatenate([prompt, reply[:-1]])
        logits = model(text)[len(prompt) - 1 :]  # [n_reply, n_vocab]: the rows that chose each reply token
        p = probabilities(logits, SamplingParams(temperature=1.0))
        expected = np.argsort(-p, axis=1, kind="stable")[:, :4]
        np.testing.assert_array_equal(ids, expected)
        np.testing.assert_allclose(probs, np.take_along_axis(p, expected, axis=1), rtol=2e-3, atol=1e-4)
        if greedy:
            n_greedy += 1
            out = autoregressive_sample(model, prompt.tolist(), len(reply)).tokens
            assert out == reply.tolist()
            assert (ids[:, 0] == reply).all()
    assert n_greedy >= 2


def test_cli_makes_data_and_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import specdec.checkpoints.load as load
    import specdec.train.requests as requests

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: chat_model())
    monkeypatch.setattr(requests, "build_requests", lambda seed: POOL)
    args = [
        "data",
        "--model",
        "tiny",
        "--out",
        str(tmp_path),
        "--tokens",
        "20",
        "--batch",
        "2",
        "--max-reply",
        "6",
        "--shard-rows",
        "4",
        "--top-k",
        "3",
    ]
    assert main(args) == 0
    assert "reply tokens" in capsys.readouterr().err
    assert load_distill_data(tmp_path).n_tokens >= 20
    for bad, message in (
        ([*args[:-2], "--top-k", "0"], "--top-k must be at least 1"),
        ([*args, "--max-reply", "7"], "other settings"),
    ):
        assert main([*bad, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert os.stat(tmp_path / "shard-00000.npz").st_mode & 0o044  # readable by the engineers who train on it


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_recomputed_hidden_states_are_the_models_own(arch):
    """State n_layer is what forward(return_hidden) gives; state l, normed, what a pass through l blocks gives."""
    from specdec.model.gpt2 import GPT2, HParams, layer_norm, random_weights
    from specdec.model.llama import rms_norm
    from specdec.train.features import layer_states

    if arch == "llama":
        model = chat_model()

        def norm(x):
            return rms_norm(x, model.weights.norm_f, model.hparams.rms_eps)
    else:
        h = HParams(n_vocab=40, n_ctx=32, n_embd=16, n_head=2, n_layer=3)
        model = GPT2(h, random_weights(h, seed=1, scale=0.3))

        def norm(x):
            return layer_norm(x, model.weights.ln_f_weight, model.weights.ln_f_bias, h.layer_norm_epsilon)

    n = model.n_layer
    rows = [[5, 9, 2, 7, 1], [3], [4, 4, 8]]
    states = layer_states(model, rows, [0, 1, n])
    for row, s in zip(rows, states):
        assert s.shape == (3, len(row), model.n_embd) and s.dtype == np.float32
        _, final = model.forward(row, model.new_cache(), return_hidden=True)
        np.testing.assert_allclose(s[2], final, atol=1e-5)
        _, after_one = model.forward(row, model.new_cache(), n_layer=1, return_hidden=True)
        np.testing.assert_allclose(norm(s[1]), after_one, atol=1e-5)
    with pytest.raises(ValueError, match="layers must be in"):
        layer_states(model, rows, [n + 1])


def test_hidden_states_of_the_data_line_up_with_the_labels(tmp_path):
    """Position n_prompt - 1 + j's final state is the one whose logits the label of reply token j came from."""
    from specdec.train.features import hidden_states

    model = chat_model()
    make_data(model, tmp_path, 30, POOL, **SETTINGS)
    data = load_distill_data(tmp_path, model)
    seen = 0
    for r, states in hidden_states(model, data, [model.n_layer], batch=3):
        n_prompt, n_reply = len(data.prompts[r]), len(data.replies[r])
        assert states.shape == (1, n_prompt + n_reply - 1, model.n_embd)
        logits = states[0, n_prompt - 1 :] @ model.weights.wte.T  # the tied LM head  [n_reply, n_vocab]
        np.testing.assert_array_equal(logits.argmax(axis=1), data.top_ids[r][:, 0])
        seen += 1
    assert seen == len(data.replies)


def test_rows_that_cannot_fit_the_memory_free_are_refused_before_any_is_made(tmp_path, monkeypatch):
    """--batch rows (a shard's at most) each hold a KV cache of a reply: checked against the memory free now
    before the first row is made or the folder written (the free memory is set small here)."""
    from specdec.model import attention as cache
    from specdec.train import distill

    monkeypatch.setattr(distill, "answer", lambda *a, **k: pytest.fail("rows were made"))
    monkeypatch.setattr(cache, "memory_available", lambda: 40_000)  # 3 rows x 64 positions x 256 bytes: 49 kB
    make_data(chat_model(), tmp_path / "fits", 1, POOL, **{**SETTINGS, "batch": 2}, stop_after=0)
    with pytest.raises(ValueError, match="--batch 3: 3 rows need at least .* decode fewer rows at once"):
        make_data(chat_model(), tmp_path / "data", 50, POOL, **SETTINGS)
    assert not (tmp_path / "data").exists()
