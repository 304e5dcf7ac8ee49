"""The shipped draft's file (checkpoints/draft.py): written and read back as an ordinary Llama on the target's
embedding, and refused with one line when damaged, edited, not finite, too large or made for another target.
On tiny random Llamas; the real file is loaded in the slow set (tests/test_draft_model.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdec.cli.main import main
from specdec.checkpoints import draft, names, registry
from specdec.checkpoints.pairs import write_pair
from specdec.checkpoints.registry import known_models
from specdec.checkpoints.safetensors import CheckpointError, read_safetensors
from specdec.model.llama import Llama, LlamaHParams, random_llama
from specdec.model.restricted import RestrictedLlama
from specdec.train.draft_model import draft_shape, init_params

H = LlamaHParams(n_vocab=64, n_ctx=64, n_embd=32, n_head=4, n_kv_head=2, n_layer=3, n_ff=48)
TARGET = random_llama(H, seed=1)
IDS = np.arange(0, 64, 2)  # a draft vocabulary of 32 tokens
SHAPE = draft_shape(TARGET, [0], 40)


def saved(folder, ids=IDS):
    draft.save_draft(folder, TARGET, SHAPE, init_params(TARGET, SHAPE), ids, {"steps": 0})
    return folder


def config_of(folder) -> dict:
    return json.loads((folder / draft.CONFIG_FILE).read_text())


def set_config(folder, **changes):
    config = config_of(folder)
    config.update(changes)
    (folder / draft.CONFIG_FILE).write_text(json.dumps(config))


def rewrite_tensors(folder, change, dtype="F16"):
    """Tensors changed by change(dict), written as a consistent pair (draft.json naming them, right sha256)."""
    config = config_of(folder)
    tensors = {k: np.array(v) for k, v in read_safetensors(folder / config["weights_file"]).items()}
    change(tensors)
    meta = {k: v for k, v in config.items() if k not in ("weights_file", "weights_sha256")}
    write_pair(folder, draft.CONFIG_FILE, draft.WEIGHTS_STEM, tensors, meta, dtype=dtype)


def refused(folder, target=TARGET) -> str:
    with pytest.raises(CheckpointError) as e:
        draft.load_draft(target, folder)
    message = str(e.value)
    assert "\n" not in message and str(folder) in message
    return message


def test_a_saved_draft_loads_as_a_restricted_llama_on_the_targets_embedding(tmp_path):
    model = draft.load_draft(TARGET, saved(tmp_path))
    assert isinstance(model, Llama) and isinstance(model, RestrictedLlama) and model.name == draft.NAME
    assert model.n_layer == 1 and model.hparams.n_ff == 40 and model.weights.wte is TARGET.weights.wte
    logits = model(np.array([3, 5, 7]))
    assert logits.shape == (3, 64) and logits.dtype == np.float32
    assert np.isneginf(logits[:, 1::2]).all() and np.isfinite(logits[:, ::2]).all()
    # float16 storage: the tensors are the initial ones rounded to float16, computed in float32
    params = init_params(TARGET, SHAPE)
    half = {k: v.astype(np.float16).astype(np.float32) for k, v in params.items()}
    expected = draft.build_draft(TARGET, SHAPE, half, IDS)(np.array([3, 5, 7]))
    np.testing.assert_array_equal(logits, expected)
    assert (tmp_path / config_of(tmp_path)["weights_file"]).stat().st_size < 2 * sum(
        v.size for v in params.values()
    ) + 4096


def test_init_copies_target_blocks_and_keeps_the_strongest_mlp_units():
    shape = draft_shape(TARGET, [2, 0], None)
    params = init_params(TARGET, shape)
    np.testing.assert_array_equal(params["blk.0.attn_q"], TARGET.weights.blocks[2].attn_q.w_t)
    np.testing.assert_array_equal(params["blk.1.ffn_down"], TARGET.weights.blocks[0].ffn_down.w_t)
    full = draft.build_draft(
        TARGET, draft_shape(TARGET, [0, 1, 2], None), init_params(TARGET, draft_shape(TARGET, [0, 1, 2], None)), None
    )
    np.testing.assert_allclose(full(np.array([1, 2, 3])), TARGET(np.array([1, 2, 3])), rtol=1e-5, atol=1e-5)
    narrow = init_params(TARGET, SHAPE)  # 40 of 48 units
    assert narrow["blk.0.ffn_gate"].shape == (40, 32) and narrow["blk.0.ffn_down"].shape == (32, 40)
    with pytest.raises(ValueError, match="--n-ff must be in 1..48"):
        draft_shape(TARGET, [0], 49)
    with pytest.raises(ValueError, match="--layers must name target layers in 0..2"):
        draft_shape(TARGET, [3], None)


def test_a_missing_folder_says_how_to_train(tmp_path):
    assert "no trained draft here" in refused(tmp_path / "none") and "python -m specdec.train draft" in refused(
        tmp_path
    )


def test_a_truncated_or_replaced_tensors_file_is_refused(tmp_path):
    weights = saved(tmp_path) / config_of(tmp_path)["weights_file"]
    weights.write_bytes(weights.read_bytes()[:-100])
    assert "sha256 differs" in refused(tmp_path)


def test_an_edited_config_is_refused(tmp_path):
    saved(tmp_path)
    set_config(tmp_path, n_ff=48)  # the tensors are 40 wide
    assert "has shape" in refused(tmp_path)
    set_config(tmp_path, n_ff=40, n_layer=True)  # JSON's true is not a number of layers
    assert "'n_layer' is True" in refused(tmp_path)
    set_config(tmp_path, n_layer=1, vocab_ids=[4, 2])
    assert "distinct increasing ids" in refused(tmp_path)
    set_config(tmp_path, vocab_ids=[0, 64])
    assert "distinct increasing ids in 0..63" in refused(tmp_path)
    set_config(tmp_path, vocab_ids=IDS.tolist(), format="something else")
    assert "not a draft written by specdec" in refused(tmp_path)
    (tmp_path / draft.CONFIG_FILE).write_text("[1, 2")
    assert "not valid JSON" in refused(tmp_path)


def test_nan_float32_and_oversized_tensors_are_refused(tmp_path, monkeypatch):
    saved(tmp_path)
    rewrite_tensors(tmp_path, lambda t: t["blk.0.ffn_up"].__setitem__((0, 0), np.nan))
    assert "'blk.0.ffn_up' holds NaN" in refused(tmp_path)
    rewrite_tensors(tmp_path, lambda t: t["blk.0.ffn_up"].__setitem__((0, 0), 0), dtype="F32")
    assert "stored as F32, not F16" in refused(tmp_path)
    rewrite_tensors(tmp_path, lambda t: t.pop("output_norm"))
    assert "'output_norm' is missing" in refused(tmp_path)
    saved(tmp_path)
    monkeypatch.setattr(draft, "MAX_BYTES", 1000)
    assert "more than the 1,000 a file of its kind may be" in refused(tmp_path)
    with pytest.raises(ValueError, match="use fewer blocks or a narrower MLP"):
        saved(tmp_path / "big")
    assert not (tmp_path / "big").exists()


def test_a_draft_for_another_target_is_refused(tmp_path):
    saved(tmp_path)
    assert "whose weights differ from the target" in refused(tmp_path, random_llama(H, seed=2))
    wider = random_llama(LlamaHParams(n_vocab=64, n_ctx=64, n_embd=48, n_head=4, n_kv_head=2, n_layer=1, n_ff=48))
    assert "n_embd=32, but the target 'random-llama' has n_embd=48" in refused(tmp_path, wider)


def test_save_refuses_values_float16_cannot_hold(tmp_path):
    params = init_params(TARGET, SHAPE)
    params["output_norm"][0] = 1e6  # float16 tops out at 65504
    with pytest.raises(ValueError, match="not finite in float16"):
        draft.save_draft(tmp_path, TARGET, SHAPE, params, IDS, {})
    assert not (tmp_path / draft.CONFIG_FILE).exists()


def test_the_name_is_known_to_the_registry_the_help_and_the_cache(tmp_path, monkeypatch, capsys):
    card = registry.card(draft.NAME)
    assert card is not None and card.tokenizer == "smollm2" and card.width == 576
    assert draft.NAME in known_models()
    names.check_pair(draft.TARGET, draft.NAME)  # same tokenizer: accepted by names alone
    with pytest.raises(SystemExit):
        main(["--help"])
    assert draft.NAME in capsys.readouterr().out
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(draft, "FOLDER", tmp_path / "none")
    assert main(["cache"]) == 0
    assert "(absent)" in capsys.readouterr().out.split(draft.NAME)[1].splitlines()[0]
    monkeypatch.setattr(draft, "FOLDER", saved(tmp_path / "shipped"))
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"{draft.NAME} " in out and "--draft smollm2-draft" in out and "(absent)" not in out.split(draft.NAME)[1]


@pytest.mark.parametrize(
    "ids,says",
    [
        ([0, 2**63], "distinct increasing ids in 0..63"),
        ([-(2**70), 2], "distinct increasing ids"),
        ([0, 2**63, 2**64], "distinct increasing ids"),
        ([1.0, 2.0], "not a list of whole numbers"),
    ],
)
def test_a_vocabulary_id_numpy_cannot_hold_is_one_line(tmp_path, ids, says):
    """2**63 does not fit an int64: checked as a number before NumPy sees it, not an OverflowError."""
    saved(tmp_path)
    set_config(tmp_path, vocab_ids=ids)
    assert says in refused(tmp_path)


@pytest.mark.parametrize("which", ["draft.json", "weights"])
@pytest.mark.parametrize("special", ["a FIFO", "a link to /proc/self/pagemap", "a link to /dev/zero"])
def test_a_special_file_in_the_drafts_place_is_refused_at_once(tmp_path, which, special):
    import os
    import threading

    saved(tmp_path)
    path = tmp_path / (draft.CONFIG_FILE if which == "draft.json" else config_of(tmp_path)["weights_file"])
    path.unlink()
    if special == "a FIFO":
        os.mkfifo(path)
    else:
        path.symlink_to(special.split()[-1])
    said = []
    thread = threading.Thread(target=lambda: said.append(refused(tmp_path)), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), f"{special} as {which} hangs the load"
    assert said and path.name in said[0], said
