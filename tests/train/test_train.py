"""specdec.train: self-distillation data, training that works, checkpoint/resume, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_model, write_checkpoint
from helpers import learnable_model

from specdec.checkpoints.safetensors import read_safetensors
from specdec.drafters import medusa
from specdec.drafters.heads import load_heads
from specdec.train import loop as train_module
from specdec.train import main, self_distill, train


# A small random GPT-2 whose vocabulary fits its width (64 tokens, 64 dims), with
# peaky distributions (scale 1): its greedy and sampled text has structure that
# a head can learn in a few hundred steps, which a flat random model lacks.
def quiet(*_):
    pass


@pytest.mark.parametrize("start", [None, [5, 9, 2]], ids=["endoftext", "chat-template"])
def test_self_distilled_features_are_the_targets_hidden_states(start, monkeypatch):
    """Every sequence begins where start_tokens says (<|endoftext|>, or a chat model's template, here
    three stand-in tokens), and every position's feature is the hidden state a plain pass computes."""
    from specdec.train import data

    target = learnable_model()
    if start is not None:
        monkeypatch.setattr(data, "start_tokens", lambda target: start)
    tokens, features = self_distill(target, 40, 20, np.random.default_rng(0), greedy_frac=0.5, progress=False)
    assert tokens.shape == (2, 20) and features.shape == (2, 20, 64) and features.dtype == np.float32
    expected = start or [target.n_vocab - 1]  # <|endoftext|>, last in a GPT-2 vocabulary
    assert (tokens[:, : len(expected)] == expected).all()
    for s in range(2):
        logits, hidden = target.forward(tokens[s], target.new_cache(), return_hidden=True)
        np.testing.assert_allclose(features[s], hidden, rtol=1e-4, atol=1e-5)
    if start is not None:
        with pytest.raises(ValueError, match="leaves no room to write"):
            self_distill(target, 40, 6, np.random.default_rng(0), progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_few_hundred_steps_raise_held_out_accuracy_well_above_the_untrained_heads(kind, tmp_path):
    config = train(kind, learnable_model(), 3000, tmp_path, steps=300, seq_len=32, lr=1e-2, progress=False, log=quiet)
    before = np.array(config["held_out"]["top1_top5_untrained"])  # [n_heads, 2]
    after = np.array(config["held_out"]["top1_top5"])
    # Untrained Medusa heads are the LM head (they guess the next token again); EAGLE starts random.
    # Measured: Medusa top-1 about 0.06 -> 0.45 per head, EAGLE 0.01 -> 0.59.
    assert (after[:, 0] > before[:, 0] + 0.2).all(), (before, after)
    assert (after[:, 1] > before[:, 1] + 0.2).all(), (before, after)


def test_restricted_vocabulary_heads_keep_only_the_most_frequent_tokens(tmp_path):
    target = learnable_model()
    train("medusa", target, 600, tmp_path, n_heads=2, steps=5, seq_len=16, vocab_top=10, progress=False, log=quiet)
    config, params, vocab = load_heads(tmp_path, "medusa", target, medusa.param_shapes)
    assert config["draft_vocab"] == 10 and len(vocab.ids) == 10 and vocab.w.shape == (10, 64)
    with np.load(tmp_path / "data.npz") as data:
        counts = np.bincount(data["tokens"].ravel(), minlength=64)
    assert counts[vocab.ids].min() >= np.delete(counts, vocab.ids).max()


def saved_heads(folder):
    """The tensors of the heads saved in folder (heads.json names the weights file)."""
    return read_safetensors(folder / json.loads((folder / "heads.json").read_text())["weights_file"])


def cli(tmp_path, *extra):
    return main(
        [
            "medusa",
            "--model",
            str(tmp_path / "model"),
            "--tokens",
            "400",
            "--out",
            str(tmp_path / "heads"),
            "--seq-len",
            "16",
            "--heads",
            "2",
            "--quiet",
            *extra,
        ]
    )


@pytest.fixture
def model_folder(tmp_path):
    return write_checkpoint(tmp_path / "model", tiny_model())  # with tokenizer files, as load_model wants


def test_resuming_an_interrupted_run_gives_the_same_heads(tmp_path, model_folder, monkeypatch):
    assert cli(tmp_path, "--steps", "12", "--save-every", "4") == 0
    straight = saved_heads(tmp_path / "heads")

    # The same run, stopped after step 8 (as if interrupted), then resumed.
    real_save = train_module.save_checkpoint

    def stop_after_8(out, settings, opt, step):
        real_save(out, settings, opt, step)
        if step == 8:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "save_checkpoint", stop_after_8)
    out2 = tmp_path / "second"
    args = [
        "medusa",
        "--model",
        str(model_folder),
        "--tokens",
        "400",
        "--out",
        str(out2),
        "--seq-len",
        "16",
        "--heads",
        "2",
        "--quiet",
        "--steps",
        "12",
        "--save-every",
        "4",
    ]
    assert main(args) == 130
    assert json.loads((out2 / "checkpoint.json").read_text())["step"] == 8
    assert not (out2 / "heads.json").exists()  # nothing passes for finished heads
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)
    assert main([*args, "--resume"]) == 0
    resumed = saved_heads(out2)
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name])


def test_cli_errors_are_one_line(tmp_path, model_folder, capsys):
    assert cli(tmp_path, "--resume") == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert cli(tmp_path, "--steps", "2", "--save-every", "1") == 0
    assert cli(tmp_path, "--steps", "3", "--resume", "--vocab-top", "5") == 2
    assert "other settings (vocab_top)" in capsys.readouterr().err
    assert main(["eagle", "--model", str(tmp_path / "missing"), "--tokens", "10", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert cli(tmp_path, "--seq-len", "3") == 2
    assert "too short" in capsys.readouterr().err


def test_eval_text_reports_teacher_forced_accuracy_on_held_out_text(tmp_path, model_folder, capsys):
    text = tmp_path / "held_out.txt"
    text.write_text("the cat sat on the mat, and then the cat sat on the hat. " * 20)
    assert cli(tmp_path, "--steps", "3", "--eval-text", str(text)) == 0
    assert "--eval-text (" in capsys.readouterr().out
    result = json.loads((tmp_path / "heads" / "heads.json").read_text())["held_out_text"]
    assert result["tokens"] >= 16 and len(result["top1_top5"]) == 2
    assert all(0 <= a <= b <= 1 for a, b in result["top1_top5"])  # top-1 never beats top-5
    text.write_text("too short")
    assert cli(tmp_path, "--steps", "3", "--eval-text", str(text)) == 2
    assert "fewer than one window" in capsys.readouterr().err
