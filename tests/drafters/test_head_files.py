"""Head folders (heads.json + its weights file) that are hostile, damaged or made for another model:
each is refused by the one loader (drafters/heads.py load_heads) with one line naming the file, through
the API and through the command line (exit 1, no traceback, no raw escape sequence). Issue 22."""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np
import pytest
from conftest import tiny_model, write_checkpoint

from specdec.cli.main import main
from specdec.checkpoints.safetensors import read_safetensors, write_safetensors
from specdec.drafters import eagle, eagle_grad, make_drafter, medusa
from specdec.drafters.heads import DraftVocab, HeadFileError, model_fingerprint, save_heads
from specdec.model.gpt2 import GPT2, Weights

TARGET = tiny_model(seed=0)  # n_embd 32, n_head 4, n_vocab 262
IDS = np.arange(0, 200, 3)  # a restricted draft vocabulary of 67 tokens


def make_heads(folder, kind: str, restricted: bool = True):
    rng = np.random.default_rng(0)
    vocab = DraftVocab.of(TARGET, IDS if restricted else None)
    if kind == "medusa":
        params = {"w": rng.standard_normal((2, 32, 32)).astype(np.float32) * 0.1, "b": np.zeros((2, 32), np.float32)}
        config = {"n_heads": 2}
    else:
        params, config = eagle_grad.init_params(32, rng), {"n_heads": 1}
    save_heads(folder, kind, TARGET, params, config, vocab)
    return folder


def config_of(folder) -> dict:
    return json.loads((folder / "heads.json").read_text())


def weights_path(folder):
    return folder / config_of(folder).get("weights_file", "heads.safetensors")


def set_config(folder, **changes):
    """Change heads.json fields (None removes one)."""
    config = config_of(folder)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "heads.json").write_text(json.dumps(config))


def set_tensors(folder, change):
    """Rewrite the weights (change(tensors) edits the dict) and keep heads.json naming them, so that only
    the contents are wrong: the damage a hostile or buggy writer would make consistently."""
    path = weights_path(folder)
    tensors = {k: np.array(v) for k, v in read_safetensors(path).items()}
    change(tensors)
    write_safetensors(path, tensors)
    if "weights_sha256" in config_of(folder):
        set_config(folder, weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def nan_at(name, value=np.nan):
    def change(t):
        t[name].reshape(-1)[5] = value

    return change


def reshape(name, shape):
    def change(t):
        t[name] = np.zeros(shape, np.float32)

    return change


def drop(name):
    return lambda t: t.pop(name)


def another_model_every_block_changed() -> GPT2:
    """TARGET's embeddings and final LayerNorm (all the old fingerprint read), every block from another model."""
    other = tiny_model(seed=9)
    w = TARGET.weights
    return GPT2(TARGET.hparams, Weights(w.wte, w.wpe, other.weights.blocks, w.ln_f_weight, w.ln_f_bias), name="other")


ESCAPE = "\x1b[2J\x1b[31mpwned\x07"
PAGEMAP, URANDOM = "/proc/self/pagemap", "/dev/urandom"


def replaced(path, make):
    """Remove the file at `path` and make something else there (make(path))."""
    path.unlink()
    make(path)


def link_to(target):
    return lambda path: path.symlink_to(target)


# name: (kind, what to do to a good folder, a piece of the message). Every one must be refused.
HOSTILE = {
    # heads.json itself
    "json: a list": ("medusa", lambda f: (f / "heads.json").write_text("[1, 2, 3]"), "JSON object"),
    "json: nested 100000 deep": ("medusa", lambda f: (f / "heads.json").write_text("[" * 100_000), "heads.json"),
    "json: an object nested deep inside": (
        "eagle",
        lambda f: (f / "heads.json").write_text(
            '{"kind": "eagle", "x": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}"
        ),
        "heads.json",
    ),
    "json: not JSON": ("medusa", lambda f: (f / "heads.json").write_text("kind = medusa"), "not valid JSON"),
    "json: not UTF-8": ("medusa", lambda f: (f / "heads.json").write_bytes(b'{"kind": "\xff\xfe"}'), "heads.json"),
    "json: empty": ("medusa", lambda f: (f / "heads.json").write_text(""), "not valid JSON"),
    "json: a string": ("eagle", lambda f: (f / "heads.json").write_text('"eagle"'), "JSON object"),
    "json: 2 MB": ("medusa", lambda f: set_config(f, padding="x" * 2_000_000), "too large"),
    "kind: missing": ("medusa", lambda f: set_config(f, kind=None), "no 'kind'"),
    "kind: escape sequences": ("medusa", lambda f: set_config(f, kind=ESCAPE), "kind"),
    "kind: a list": ("eagle", lambda f: set_config(f, kind=["eagle"]), "kind"),
    "kind: the other kind": ("medusa", lambda f: set_config(f, kind="eagle"), "not 'medusa'"),
    "model: escape sequences": ("medusa", lambda f: set_config(f, model=ESCAPE, n_embd=48), "n_embd"),
    "n_head: missing": ("eagle", lambda f: set_config(f, n_head=None), "n_head"),
    "n_head: not training's": ("eagle", lambda f: set_config(f, n_head=2), "n_head"),
    "n_head: true": ("eagle", lambda f: set_config(f, n_head=True), "n_head"),
    "layer_norm_epsilon: missing": ("eagle", lambda f: set_config(f, layer_norm_epsilon=None), "layer_norm_epsilon"),
    "layer_norm_epsilon: NaN": (
        "eagle",
        lambda f: (f / "heads.json").write_text(
            (f / "heads.json").read_text().replace('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": NaN')
        ),
        "layer_norm_epsilon",
    ),
    "layer_norm_epsilon: not training's": (
        "medusa",
        lambda f: set_config(f, layer_norm_epsilon=0.1),
        "layer_norm_epsilon",
    ),
    "n_embd: missing": ("medusa", lambda f: set_config(f, n_embd=None), "n_embd"),
    "n_embd: a string": ("medusa", lambda f: set_config(f, n_embd="32"), "n_embd"),
    "n_vocab: another": ("medusa", lambda f: set_config(f, n_vocab=50257), "n_vocab"),
    "n_heads: missing": ("medusa", lambda f: set_config(f, n_heads=None), "n_heads"),
    "n_heads: zero": ("medusa", lambda f: set_config(f, n_heads=0), "n_heads"),
    "n_heads: fractional": ("medusa", lambda f: set_config(f, n_heads=1.5), "n_heads"),
    "n_heads: a billion": ("medusa", lambda f: set_config(f, n_heads=10**9), "n_heads"),
    "draft_vocab: missing": ("medusa", lambda f: set_config(f, draft_vocab=None), "draft_vocab"),
    "draft_vocab: past n_vocab": ("medusa", lambda f: set_config(f, draft_vocab=10**6), "draft_vocab"),
    "model_fingerprint: missing": ("medusa", lambda f: set_config(f, model_fingerprint=None), "model_fingerprint"),
    "model_fingerprint: a number": ("eagle", lambda f: set_config(f, model_fingerprint=7), "model_fingerprint"),
    "model_fingerprint: the old kind": (
        "medusa",
        lambda f: set_config(f, model_fingerprint="0123456789abcdef"),
        "train",
    ),
    # special files (a FIFO would hang a plain open; /proc/self/pagemap is a "regular file" of size 0 that reads
    # for ever; /dev/zero never ends): refused at once, on the object the name leads to
    "json: a FIFO": ("medusa", lambda f: replaced(f / "heads.json", os.mkfifo), "not a regular file"),
    "json: a link to /proc/self/pagemap": ("eagle", lambda f: replaced(f / "heads.json", link_to(PAGEMAP)), "json"),
    "json: a link to /dev/zero": ("medusa", lambda f: replaced(f / "heads.json", link_to("/dev/zero")), "regular"),
    "weights: a FIFO": ("eagle", lambda f: replaced(weights_path(f), os.mkfifo), "not a regular file"),
    "weights: a link to /proc/self/pagemap": ("eagle", lambda f: replaced(weights_path(f), link_to(PAGEMAP)), "heads-"),
    "weights: a link to /dev/urandom": ("medusa", lambda f: replaced(weights_path(f), link_to(URANDOM)), "regular"),
    # the weights file, and heads.json's claim about it
    "weights: missing": ("medusa", lambda f: weights_path(f).unlink(), "heads"),
    "weights: not safetensors": ("eagle", lambda f: weights_path(f).write_bytes(b"\0" * 100), "heads"),
    "weights: not safetensors, and named so": (
        "medusa",
        lambda f: (
            weights_path(f).write_bytes(b"\0" * 100),
            set_config(f, weights_sha256=hashlib.sha256(b"\0" * 100).hexdigest()),
        ),
        "safetensors",
    ),
    "weights: changed after saving": (
        "medusa",
        lambda f: weights_path(f).write_bytes(weights_path(f).read_bytes()[:-4] + b"\0\0\0\0"),
        "heads",
    ),
    "weights_file: outside the folder": (
        "medusa",
        lambda f: set_config(f, weights_file="../../etc/passwd"),
        "weights_file",
    ),
    # tensors
    "tensor: w missing": ("medusa", lambda f: set_tensors(f, drop("w")), "'w'"),
    "tensor: b missing": ("medusa", lambda f: set_tensors(f, drop("b")), "'b'"),
    "tensor: ln_1.weight missing": ("eagle", lambda f: set_tensors(f, drop("ln_1.weight")), "'ln_1.weight'"),
    "tensor: fc.weight missing": ("eagle", lambda f: set_tensors(f, drop("fc.weight")), "'fc.weight'"),
    "tensor: one too many": (
        "medusa",
        lambda f: set_tensors(f, lambda t: t.update(extra=np.zeros(3, np.float32))),
        "'extra'",
    ),
    "tensor: NaN in w": ("medusa", lambda f: set_tensors(f, nan_at("w")), "NaN"),
    "tensor: Inf in b": ("medusa", lambda f: set_tensors(f, nan_at("b", np.inf)), "NaN"),
    "tensor: NaN in ln_1.weight": ("eagle", lambda f: set_tensors(f, nan_at("ln_1.weight")), "NaN"),
    "tensor: -Inf in c_fc": ("eagle", lambda f: set_tensors(f, nan_at("mlp.c_fc.weight", -np.inf)), "NaN"),
    "shape: w of 3 heads, config says 2": ("medusa", lambda f: set_tensors(f, reshape("w", (3, 32, 32))), "'w'"),
    "shape: b transposed": ("medusa", lambda f: set_tensors(f, reshape("b", (32, 2))), "'b'"),
    "shape: w of another width": ("medusa", lambda f: set_tensors(f, reshape("w", (2, 48, 48))), "'w'"),
    "shape: c_attn": ("eagle", lambda f: set_tensors(f, reshape("attn.c_attn.weight", (32, 64))), "c_attn"),
    "shape: fc": ("eagle", lambda f: set_tensors(f, reshape("fc.weight", (32, 32))), "'fc.weight'"),
    # the restricted vocabulary
    "vocab_ids: fractional": ("medusa", lambda f: set_tensors(f, nan_at("vocab_ids", 1.5)), "vocab_ids"),
    "vocab_ids: 2-D": (
        "medusa",
        lambda f: set_tensors(f, lambda t: t.update(vocab_ids=t["vocab_ids"][None])),
        "vocab_ids",
    ),
    "vocab_ids: negative": ("eagle", lambda f: set_tensors(f, nan_at("vocab_ids", -3.0)), "vocab_ids"),
    "vocab_ids: past n_vocab": ("medusa", lambda f: set_tensors(f, nan_at("vocab_ids", 262.0)), "vocab_ids"),
    "vocab_ids: repeated": ("medusa", lambda f: set_tensors(f, nan_at("vocab_ids", 0.0)), "vocab_ids"),
    "vocab_ids: NaN": ("eagle", lambda f: set_tensors(f, nan_at("vocab_ids")), "vocab_ids"),
    "vocab_ids: fewer than draft_vocab": (
        "medusa",
        lambda f: set_tensors(f, lambda t: t.update(vocab_ids=t["vocab_ids"][:-1])),
        "vocab_ids",
    ),
    "vocab_ids: missing": ("medusa", lambda f: set_tensors(f, drop("vocab_ids")), "vocab_ids"),
}


def load(kind, folder, target=TARGET):
    return (medusa.MedusaDrafter if kind == "medusa" else eagle.EagleDrafter).load(str(folder), target)


def assert_one_clean_line(message: str, folder):
    assert "\n" not in message and "\r" not in message, message
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", message), f"a raw control character in {message!r}"
    assert str(folder) in message, message


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_head_folder_is_refused_in_one_line_naming_the_file(tmp_path, case):
    kind, damage, says = HOSTILE[case]
    folder = make_heads(tmp_path / "heads", kind)
    load(kind, folder)  # good before the damage
    damage(folder)
    with pytest.raises(HeadFileError) as e:
        load(kind, folder)
    assert_one_clean_line(str(e.value), folder)
    assert says in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cli") / "target", TARGET)


@pytest.mark.parametrize("case", HOSTILE)
def test_the_command_line_prints_one_line_and_exits_1(tmp_path, target_folder, capsys, case):
    kind, damage, _ = HOSTILE[case]
    folder = make_heads(tmp_path / "heads", kind)
    damage(folder)
    code = main(
        [
            "--target_model_size",
            str(target_folder),
            "--draft",
            f"{kind}:{folder}",
            "--prompt",
            "the",
            "--n_tokens_to_generate",
            "2",
            "--no_warmup",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert err.startswith("specdec: error: ") and err.count("\n") == 1, err
    assert_one_clean_line(err.rstrip("\n"), folder)


def test_heads_for_another_model_with_every_block_changed_are_refused(tmp_path):
    """Same embeddings and final LayerNorm, every block different: the fingerprint covers every tensor."""
    folder = make_heads(tmp_path / "m", "medusa")
    with pytest.raises(HeadFileError, match="other weights"):
        load("medusa", folder, another_model_every_block_changed())
    assert model_fingerprint(another_model_every_block_changed()) != model_fingerprint(TARGET)


def test_the_fingerprint_sees_every_tensor_and_not_the_storage():
    """A change to any one tensor changes it; a float64 copy or a kept-layout load does not."""
    base = model_fingerprint(TARGET)
    assert model_fingerprint(TARGET.astype(np.float64)) == base
    for i, name in [(0, "ln_2_bias"), (1, "mlp_c_proj")]:
        block = TARGET.weights.blocks[i]
        old = getattr(block, name)
        arr = old.w_t if name == "mlp_c_proj" else old
        keep = arr.copy()
        arr.reshape(-1)[0] += 1  # the first element is always sampled
        try:
            assert model_fingerprint(TARGET) != base, name
        finally:
            arr[...] = keep
    assert model_fingerprint(TARGET) == base


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_good_heads_load_and_a_tilde_is_expanded(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("HOME", str(tmp_path))
    make_heads(tmp_path / "heads", kind, restricted=(kind == "medusa"))
    drafter = make_drafter(f"{kind}:~/heads", TARGET)
    assert drafter.vocab.restricted == (kind == "medusa")


def test_a_save_interrupted_between_its_two_files_leaves_the_old_pair(tmp_path, monkeypatch):
    """heads.json names its weights file (by content): the new weights file is written first, heads.json
    replaced second, so a kill in between leaves the old heads.json naming the old (still present) weights."""
    from specdec import safe_io

    folder = make_heads(tmp_path / "m", "medusa")
    old = load("medusa", folder).params["w"].copy()
    real_replace = safe_io.write.os.replace

    def killed_before_the_json(src, dst):
        if str(dst).endswith("heads.json"):
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(safe_io.write.os, "replace", killed_before_the_json)
    params = {"w": np.ones((2, 32, 32), np.float32), "b": np.zeros((2, 32), np.float32)}
    with pytest.raises(KeyboardInterrupt):
        save_heads(folder, "medusa", TARGET, params, {"n_heads": 2}, DraftVocab.of(TARGET, IDS))
    monkeypatch.undo()
    np.testing.assert_array_equal(load("medusa", folder).params["w"], old)
    assert not list(folder.glob("*.tmp")) and not list(folder.glob(".*tmp*")), "no temporary file left"
    save_heads(folder, "medusa", TARGET, params, {"n_heads": 2}, DraftVocab.of(TARGET, IDS))
    np.testing.assert_array_equal(load("medusa", folder).params["w"], params["w"])
    assert len(list(folder.glob("heads-*.safetensors"))) == 1, "the old weights file is gone once replaced"


def test_non_finite_heads_are_never_saved(tmp_path):
    params = {"w": np.full((2, 32, 32), np.nan, np.float32), "b": np.zeros((2, 32), np.float32)}
    with pytest.raises(ValueError, match="NaN"):
        save_heads(tmp_path / "m", "medusa", TARGET, params, {"n_heads": 2}, DraftVocab.of(TARGET))
    assert not (tmp_path / "m" / "heads.json").exists()


def test_heads_for_a_llama_target_round_trip_and_tell_models_apart(tmp_path):
    """The fingerprint walks whatever weights the model has (GPT-2's or Llama's), every array of them."""
    from specdec.model.llama import random_llama

    target = random_llama(seed=1, scale=0.3)
    params = {"w": np.full((2, 32, 32), 0.01, np.float32), "b": np.zeros((2, 32), np.float32)}
    save_heads(tmp_path / "m", "medusa", target, params, {"n_heads": 2}, DraftVocab.of(target))
    drafter = medusa.MedusaDrafter.load(tmp_path / "m", target)
    np.testing.assert_array_equal(drafter.params["w"], params["w"])
    other = random_llama(seed=1, scale=0.3)
    other.weights.blocks[-1].ffn_down.w_t.reshape(-1)[0] += 1  # one tensor of the last block
    with pytest.raises(HeadFileError, match="other weights"):
        medusa.MedusaDrafter.load(tmp_path / "m", other)
