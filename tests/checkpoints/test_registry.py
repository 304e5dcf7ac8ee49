"""One row per named model (specdec/checkpoints/registry.py): a row is all a name needs to be known to the
loader, the checks by name, the messages and the cache; one row per architecture in gguf.py is all a GGUF
architecture needs to reach its reader."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model, write_checkpoint
from test_gguf import tiny_llama_gguf

from specdec.checkpoints import gguf, names, registry, store
from specdec.checkpoints.gguf_file import GGUFFile
from specdec.checkpoints.hub import resolve_model
from specdec.checkpoints.load import load_model
from specdec.model.llama import LlamaHParams, random_llama

ROW = registry.ModelCard("tiny-row", registry.HUB, "tiny-org/tiny-row", "gpt2", 2, 32, "gpt2", 64, False, 1_000)


def test_a_new_row_is_all_a_name_needs(fake_hub, tmp_path, monkeypatch):
    model = tiny_model(seed=4)
    assert (model.n_layer, model.n_embd, model.n_ctx) == (ROW.layers, ROW.width, ROW.n_ctx)
    fake_hub.add_checkpoint(ROW.where, write_checkpoint(tmp_path / "src", model))
    monkeypatch.setitem(registry.MODELS, ROW.name, ROW)
    models_dir = tmp_path / "home" / "models"

    assert registry.card(ROW.name) is ROW and registry.card(ROW.where) is ROW  # by name and by repo id
    assert resolve_model(ROW.name, models_dir) == (models_dir / "tiny-org--tiny-row", ROW.where)
    assert f" {ROW.name}," in registry.known_models() and registry.download_size(ROW.where) == ROW.download
    with pytest.raises(ValueError, match="early exit needs 1 <= L < 2"):
        names.check_pair(ROW.name, early_exit=2)  # decided by the row alone
    loaded = load_model(ROW.name, models_dir, progress=False, settings=fake_hub.settings())
    np.testing.assert_allclose(loaded([1, 2, 3]), model([1, 2, 3]), atol=1e-6)
    stored = store.entries(tmp_path / "home", models_dir)
    assert [(e.kind, e.name) for e in stored] == [("model", ROW.name)]  # listed by its name, not its folder's
    assert store.find(ROW.where, tmp_path / "home", models_dir) == stored  # removable by repo id too


def test_every_row_is_well_formed():
    for name, card in registry.MODELS.items():
        assert card.name == name and card.tokenizer in registry.TOKENIZERS and card.architecture in ("gpt2", "llama")
        assert card.source in (registry.HUB, registry.WHEEL, registry.SHIPPED), name
        assert (card.download == 0) == (card.source == registry.SHIPPED and card.base is None), name
        if card.source == registry.SHIPPED:
            assert registry.shipped_folder(name).is_dir(), name
        if card.base is not None:
            assert registry.card(card.base).tokenizer == card.tokenizer, name
    for alias, name in registry.ALIASES.items():
        assert alias not in registry.MODELS and name in registry.MODELS
    for target, _ in registry.SHIPPED_HEADS:
        assert target in registry.MODELS


def test_a_gguf_architecture_is_one_row(tmp_path, monkeypatch):
    """A file whose general.architecture has no row is refused by name; one row (here: llama's tensors, read
    under the architecture's own metadata keys) is all the loader needs to read it."""
    model = random_llama(LlamaHParams(n_vocab=64, n_ctx=32, n_embd=64, n_head=4, n_kv_head=2, n_layer=1, n_ff=64))
    tiny_llama_gguf(tmp_path / "llama.gguf", model)
    meta = {k.replace("llama.", "other.", 1): v for k, v in GGUFFile(tmp_path / "llama.gguf").metadata.items()}
    tiny_llama_gguf(tmp_path / "other.gguf", model, meta={**meta, "general.architecture": "other"})
    with pytest.raises(ValueError, match="architecture 'other'; specdec runs GGUF files of the 'llama' and"):
        load_model(str(tmp_path / "other.gguf"), progress=False)
    monkeypatch.setitem(gguf.ARCHITECTURES, "other", gguf.ARCHITECTURES["llama"])
    loaded = load_model(str(tmp_path / "other.gguf"), progress=False)
    np.testing.assert_allclose(loaded([1, 2, 3]), model([1, 2, 3]), atol=1e-5)
