"""Decided from names before downloading (specdec/checkpoints/registry.py, names.py): the table agrees with the shapes and files
it summarises, and impossible requests are refused in well under a second with nothing fetched or written."""

import json
import time

import pytest

from specdec.cli import main
from specdec.checkpoints import family, names, registry
from specdec.checkpoints.hub import resolve_model
from specdec.model.shapes import GPT2_SHAPES


def test_the_table_agrees_with_gpt2_shapes_and_the_shipped_configs():
    for name, h in GPT2_SHAPES.items():
        c = registry.card(name)
        assert (c.layers, c.width, c.n_ctx, c.tokenizer) == (h.n_layer, h.n_embd, h.n_ctx, "gpt2")
    for name in (family.TARGET, family.DRAFT):
        config = json.loads((registry.shipped_folder(name) / "config.json").read_text())
        c = registry.card(name)
        assert (c.layers, c.width, c.n_ctx) == (config["n_layer"], config["n_embd"], config["n_positions"])
        assert c.download == 0  # shipped
    assert registry.card("smollm2-135m").chat and not registry.card("smollm2-360m-base").chat
    assert registry.card("HuggingFaceTB/SmolLM2-360M-Instruct") == registry.card("smollm2-360m")
    assert registry.card("some/other-repo") is None and registry.card("./a/folder") is None


def test_hub_short_names_are_the_same_models(tmp_path):
    for hub_name, name in registry.ALIASES.items():
        assert resolve_model(hub_name, tmp_path) == resolve_model(name, tmp_path)
        assert registry.card(hub_name) == registry.card(name)
    assert list(tmp_path.iterdir()) == []


def test_the_default_pair_footprint():
    download, kept = names.footprint(["355M", "124M"])
    assert download == 1_520_000_000 + 548_000_000
    # transposed float32 linear weights: 12 * width^2 per layer
    assert kept == 4 * 12 * (24 * 1024**2 + 12 * 768**2) and 1.5e9 < kept < 1.6e9
    assert names.footprint(["smollm2-135m", "stdlib-6L"]) == (registry.card("smollm2-135m").download, 0)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--target_model_size", "355M", "--draft", "early_exit:30"], "early exit needs 1 <= L < 24"),
        (["--target_model_size", "stdlib-6L", "--draft", "distilgpt2"], "tokenize text differently"),
        (["--target_model_size", "gpt2-xl", "--draft", "smollm2-135m"], "give --cross_vocab tli"),
        (
            [
                "--target_model_size",
                "smollm2-135m",
                "--draft",
                "stdlib-2L",
                "--cross_vocab",
                "slem",
                "--temperature",
                "1",
            ],
            "'slem' is exact only at temperature 0",
        ),
        (["--target_model_size", "smollm2-135m", "--draft", "ngram", "--cross_vocab", "tli"], "draft here is ngram"),
        (["--target_model_size", "124M", "--chat", "--draft", "ngram"], "--chat needs a chat model"),
        (["--target_model_size", "stdlib-6L"], "124M is the default draft: give --draft"),
        (["--target_model_size", "smollm2-360m-base", "--chat", "--draft", "ngram"], "has no chat template"),
        (["--target_model_size", "355M", "--n_tokens_to_generate", "1024"], "context of 1024 tokens"),
        # no head is shipped for the target: decided from its name, not after a 548 MB download
        (["--target_model_size", "124M", "--draft", "eagle"], "no eagle head is shipped for 124M"),
        (["--target_model_size", "gpt2", "--draft", "ngram+eagle"], "no eagle head is shipped for gpt2"),
        (["--target_model_size", "./a-model.gguf", "--draft", "eagle"], "no eagle head is shipped for ./a-model.gguf"),
    ],
)
def test_impossible_requests_fail_fast_with_nothing_downloaded(argv, message, fake_hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))  # an empty home: nothing cached
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        main.main(argv)
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert seconds < 1.0, f"took {seconds:.2f} s"
    assert fake_hub.requests == [] and list(tmp_path.iterdir()) == [], "nothing fetched or written"


def test_unknown_names_are_left_to_the_load():
    names.check_pair("./my-folder", draft_model="owner/repo", early_exit=99, chat=True, n_tokens=10**6)  # no error
    names.check_pair("355M", draft_model="owner/repo")  # the draft is unknown: its tokenizer is checked after loading
