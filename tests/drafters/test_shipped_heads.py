"""`--draft eagle` / draft="eagle": the EAGLE head shipped inside specdec for a named target."""

from __future__ import annotations

import pytest

from specdec.checkpoints import store
from specdec.checkpoints.names import SHIPPED_HEADS, shipped_heads
from specdec.drafters import make_drafter
from specdec.drafters.specs import DraftSpec, parse_draft
from specdec.model.llama import LlamaHParams, random_llama


def test_a_bare_eagle_names_the_shipped_head_and_eagle_dir_a_folder():
    assert parse_draft("eagle") == DraftSpec("eagle", "")
    assert str(parse_draft("eagle")) == "eagle" and "shipped" in parse_draft("eagle").describe()
    assert parse_draft("eagle:heads/x") == DraftSpec("eagle", "heads/x")
    with pytest.raises(ValueError, match="needs the folder"):
        parse_draft("eagle:")


def test_a_target_without_a_shipped_head_is_refused_in_one_line():
    model = random_llama(LlamaHParams(n_vocab=50, n_ctx=32, n_embd=16, n_head=2, n_kv_head=1, n_layer=1, n_ff=24))
    with pytest.raises(ValueError, match="no eagle head is shipped for random-llama") as e:
        make_drafter("eagle", model)
    assert "\n" not in str(e.value) and "eagle:DIR" in str(e.value)


def test_every_shipped_head_is_named_and_listed():
    assert shipped_heads("smollm2-135m", "eagle").name == SHIPPED_HEADS[("smollm2-135m", "eagle")]
    lines = store.shipped()
    assert any("eagle for smollm2-135m" in line and "--draft eagle" in line for line in lines)
    assert any(line.startswith("stdlib-2L") for line in lines)
