"""python -m specdec.train given bad data, checkpoints or flags: one clean line (exit 2), never a traceback,
never NaN heads; one training per --out; the checkpoint's two files replaced as one. Issue 22."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import tiny_model, write_checkpoint

from specdec.checkpoints.safetensors import read_safetensors, write_safetensors
from specdec.drafters import medusa
from specdec.train import loop as train_loop
from specdec.train import main, train


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("train") / "model", tiny_model())


def run(model_folder, out, *extra, steps="2"):
    return main(
        [
            "medusa",
            "--model",
            str(model_folder),
            "--tokens",
            "400",
            "--out",
            str(out),
            "--seq-len",
            "16",
            "--heads",
            "2",
            "--quiet",
            "--steps",
            steps,
            "--save-every",
            "1",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def good_run(model_folder, tmp_path_factory):
    """A finished run (data, eval data, checkpoint at step 2, heads): the files each case damages a copy of."""
    out = tmp_path_factory.mktemp("good") / "out"
    assert run(model_folder, out) == 0
    return out


def assert_one_clean_line(capsys, *names):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for name in names:
        assert name in err, err
    return err


# --- data.npz: a cache of the self-distilled text and features ----------------------------------------


def rewrite_data(path, **changes):
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    for key, value in changes.items():
        if value is None:
            arrays.pop(key)
        else:
            arrays[key] = value
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def nan_features(path):
    with np.load(path) as data:
        features = data["features"].copy()
    features[1, 3, 5] = np.nan
    rewrite_data(path, features=features)


def wide_features(path):
    with np.load(path) as data:
        features = data["features"]
    rewrite_data(path, features=np.zeros((*features.shape[:2], 48), np.float32))


def tokens_past_the_vocabulary(path):
    with np.load(path) as data:
        tokens = data["tokens"].copy()
    tokens[0, 4] = 10**6
    rewrite_data(path, tokens=tokens)


def float_tokens(path):
    with np.load(path) as data:
        tokens = data["tokens"].astype(np.float64) + 0.5
    rewrite_data(path, tokens=tokens)


def a_folder(path):
    path.unlink()
    path.mkdir()


DATA = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "not a zip": lambda p: p.write_bytes(b"tokens,features\n1,2\n"),
    "no meta": lambda p: rewrite_data(p, meta=None),
    "meta not JSON": lambda p: rewrite_data(p, meta=np.array("{")),
    "meta a pickled object": lambda p: rewrite_data(p, meta=np.array([{"a": 1}], dtype=object)),
    "no features": lambda p: rewrite_data(p, features=None),
    "no tokens": lambda p: rewrite_data(p, tokens=None),
    "NaN features": nan_features,
    "features of another width": wide_features,
    "tokens past the vocabulary": tokens_past_the_vocabulary,
    "fractional tokens": float_tokens,
    "a folder": a_folder,
}


@pytest.mark.parametrize("which", ["data.npz", "eval.npz"])
@pytest.mark.parametrize("case", DATA)
def test_damaged_training_data_is_one_line_naming_the_file(model_folder, good_run, tmp_path, capsys, case, which):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(good_run / which, out / which)  # made with these settings: it is read, not made again
    DATA[case](out / which)
    assert run(model_folder, out) == 2
    assert_one_clean_line(capsys, str(out / which))
    assert not (out / "heads.json").exists()


# --- the checkpoint: checkpoint.json and the tensors it names ------------------------------------------------


def checkpoint_weights(out):
    return out / json.loads((out / "checkpoint.json").read_text()).get("weights_file", "checkpoint.safetensors")


def set_checkpoint(out, **changes):
    config = json.loads((out / "checkpoint.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (out / "checkpoint.json").write_text(json.dumps(config))


def set_checkpoint_tensors(out, change):
    path = checkpoint_weights(out)
    tensors = {k: np.array(v) for k, v in read_safetensors(path).items()}
    change(tensors)
    write_safetensors(path, tensors)
    if "weights_sha256" in json.loads((out / "checkpoint.json").read_text()):
        set_checkpoint(out, weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def nan_in(name):
    def change(t):
        t[name].reshape(-1)[3] = np.nan

    return change


CHECKPOINTS = {
    "a list": lambda out: (out / "checkpoint.json").write_text("[1, 2]"),
    "not JSON": lambda out: (out / "checkpoint.json").write_text("step = 2"),
    "nested deep": lambda out: (out / "checkpoint.json").write_text("[" * 100_000),
    "no step": lambda out: set_checkpoint(out, step=None),
    "a fractional step": lambda out: set_checkpoint(out, step=1.5),
    "a negative step": lambda out: set_checkpoint(out, step=-1),
    "step true": lambda out: set_checkpoint(out, step=True),
    "no adam_t": lambda out: set_checkpoint(out, adam_t=None),
    "adam_t a string": lambda out: set_checkpoint(out, adam_t="2"),
    "weights missing": lambda out: checkpoint_weights(out).unlink(),
    "weights changed": lambda out: checkpoint_weights(out).write_bytes(checkpoint_weights(out).read_bytes()[:-8]),
    "a tensor missing": lambda out: set_checkpoint_tensors(out, lambda t: t.pop("adam.v.w")),
    "a tensor of another shape": lambda out: set_checkpoint_tensors(out, lambda t: t.update(b=np.zeros(3, np.float32))),
    "NaN weights": lambda out: set_checkpoint_tensors(out, nan_in("w")),
    "NaN moments": lambda out: set_checkpoint_tensors(out, nan_in("adam.m.b")),
}


@pytest.mark.parametrize("case", CHECKPOINTS)
def test_a_damaged_checkpoint_is_one_line_naming_the_file(model_folder, good_run, tmp_path, capsys, case):
    out = tmp_path / "out"
    shutil.copytree(good_run, out)
    (out / "heads.json").unlink()
    CHECKPOINTS[case](out)
    assert run(model_folder, out, "--resume", steps="3") == 2
    assert_one_clean_line(capsys, "checkpoint")
    assert not (out / "heads.json").exists()


def test_resume_past_the_last_step_is_refused(model_folder, good_run, tmp_path, capsys):
    """The checkpoint is at step 2; --steps 1 would train -1 steps (and report a negative speed)."""
    out = tmp_path / "out"
    shutil.copytree(good_run, out)
    assert run(model_folder, out, "--resume", steps="1") == 2
    assert "step 2" in assert_one_clean_line(capsys, "--steps 1")


def test_an_interrupted_checkpoint_save_leaves_the_last_good_pair(model_folder, good_run, tmp_path, monkeypatch):
    """Killed after the new tensors are written but before checkpoint.json is replaced: --resume reads the
    old pair (step 2), not new weights with an old step count."""
    from specdec import safe_io

    out = tmp_path / "out"
    shutil.copytree(good_run, out)
    real_replace = safe_io.write.os.replace

    def killed(src, dst):
        if str(dst).endswith("checkpoint.json"):
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(safe_io.write.os, "replace", killed)
    assert run(model_folder, out, "--resume", steps="4") == 130
    monkeypatch.undo()
    assert json.loads((out / "checkpoint.json").read_text())["step"] == 2
    assert not list(out.glob(".*.tmp")), "no temporary file left"
    assert run(model_folder, out, "--resume", steps="4") == 0


# --- flags, checked before anything is allocated or generated -------------------------------------------------


FLAGS = {
    "--tokens 1000000000000": (["--tokens", "1000000000000"], "--tokens"),
    "--eval-tokens 1000000000000": (["--eval-tokens", "1000000000000"], "--eval-tokens"),
    "--tokens 0": (["--tokens", "0"], "--tokens"),
    "--lr nan": (["--lr", "nan"], "--lr"),
    "--lr inf": (["--lr", "inf"], "--lr"),
    "--lr 0": (["--lr", "0"], "--lr"),
    "--lr -0.1": (["--lr", "-0.1"], "--lr"),
    "--greedy-frac nan": (["--greedy-frac", "nan"], "--greedy-frac"),
    "--greedy-frac 1.5": (["--greedy-frac", "1.5"], "--greedy-frac"),
    "--steps 0": (["--steps", "0"], "--steps"),
    "--eval-tokens -5": (["--eval-tokens", "-5"], "--eval-tokens"),
    "--seq-len 0": (["--seq-len", "0"], "--seq-len"),
    "--save-every 0": (["--save-every", "0"], "--save-every"),
    "--vocab-top 0": (["--vocab-top", "0"], "--vocab-top"),
    "--heads 0": (["--heads", "0"], "--heads"),
    "--batch 0": (["--batch", "0"], "--batch"),
}


@pytest.mark.parametrize("case", FLAGS)
def test_bad_flags_are_one_line_before_any_work(model_folder, tmp_path, capsys, case):
    argv, names = FLAGS[case]
    out = tmp_path / "out"
    assert run(model_folder, out, *argv) == 2
    assert_one_clean_line(capsys, names)
    assert not (out / "data.npz").exists() and not (out / "heads.json").exists()


def test_an_out_that_is_a_file_is_one_line(model_folder, tmp_path, capsys):
    (tmp_path / "out").write_text("not a folder")
    assert run(model_folder, tmp_path / "out") == 2
    assert_one_clean_line(capsys, str(tmp_path / "out"))


# --- a diverging run, and two runs into one --out ------------------------------------------------------------


def test_a_nan_loss_stops_training_and_saves_nothing(tmp_path, monkeypatch):
    """The loss turns NaN at step 3 (as an absurd learning rate makes it): the run stops there with a
    message, and neither heads nor a checkpoint of NaN weights are written."""
    real = medusa.loss_and_grads
    calls = []

    def diverging(params, hs, targets, vocab):
        loss, per_head, grads = real(params, hs, targets, vocab)
        calls.append(1)
        return (float("nan") if len(calls) >= 3 else loss), per_head, grads

    monkeypatch.setattr(medusa, "loss_and_grads", diverging)
    with pytest.raises(ValueError, match=r"loss is nan at step 3.*--lr"):
        train(
            "medusa",
            tiny_model(),
            400,
            tmp_path,
            n_heads=2,
            steps=6,
            seq_len=16,
            save_every=1,
            progress=False,
            log=lambda *a: None,
        )
    assert not (tmp_path / "heads.json").exists()
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 2, "the last good checkpoint stays"


def test_an_absurd_learning_rate_ends_in_one_line_and_no_heads(model_folder, tmp_path, capsys):
    assert run(model_folder, tmp_path / "out", "--lr", "1e38", steps="20") == 2
    assert "NaN or infinite" in assert_one_clean_line(capsys, "--lr")
    assert not (tmp_path / "out" / "heads.json").exists()


HOLD = """
import fcntl, os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
fd = os.open(os.path.join(sys.argv[1], sys.argv[2]), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks")
def test_a_second_training_into_the_same_out_refuses(model_folder, tmp_path, capsys):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out), train_loop.LOCK_FILE], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        assert run(model_folder, out) == 2
        assert "another training" in assert_one_clean_line(capsys, str(out))
        assert not (out / "data.npz").exists()
    finally:
        holder.kill()
        holder.wait()
    assert run(model_folder, out) == 0, "free again once the other training ends"
