"""Suffix decoding, alone and first in a cascade, through every entry point: the API, a batch, the race, the
command line and the benchmark suite, on stdlib-6L (shipped: trained on the standard library) asked to go on
after code it has just seen, where suffix decoding drafts; at temperature 0 each gives the target's own tokens."""

from __future__ import annotations

import re

import pytest

from specdec import autoregressive_sample, load_model, speculative_sample, speculative_sample_batch
from specdec.bench import suite
from specdec.cli import main
from specdec.race import race

CODE = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef add(a, b):\n",
    "import os\nimport sys\n\n\ndef main():\n    print(os.getcwd())\n\n\nimport os\nimport",
]


@pytest.fixture(scope="module")
def target():
    return load_model("stdlib-6L", progress=False)


@pytest.fixture(scope="module")
def prompts(target):
    return [target.tokenizer.encode(code) for code in CODE]


@pytest.mark.parametrize("draft", ["suffix", "suffix:none", "suffix+early_exit:2"])
def test_the_api(target, prompts, draft):
    for prompt in prompts:
        out = speculative_sample(target, draft, prompt, 24)
        assert out.tokens == autoregressive_sample(target, prompt, 24).tokens
        assert max(out.k_per_round) > 4  # K left out: the drafter's own, beyond the others' 4


@pytest.mark.parametrize("draft", ["suffix", "suffix:none"])
def test_a_batch(target, prompts, draft):
    outs = speculative_sample_batch(target, draft, prompts, 24)
    assert [o.tokens for o in outs] == [autoregressive_sample(target, p, 24).tokens for p in prompts]
    assert sum(o.rounds for o in outs) < 2 * 24  # it drafted: fewer rounds than tokens


def test_the_race(target, prompts):
    report = race(target, "suffix:none", prompts[0], 24, repeats=1, warmup=False)
    assert report.texts_identical is True and report.spec.result.rounds < 24


def test_the_command_line(capsys):
    argv = ["--target_model_size", "stdlib-6L", "--draft", "suffix+early_exit:2", "--prompt", CODE[0]]
    code = main.main([*argv, "--n_tokens_to_generate", "16", "--repeats", "1", "--no_warmup"])
    out = capsys.readouterr().out
    assert code == 0 and "draft:  suffix decoding (the text, earlier outputs and the datastore shipped" in out
    assert re.search(r"\bK=32\b", out) and re.search(r"identical text at temperature 0 +yes", out)


def test_the_benchmark_suite(target):
    rows = suite.run_suite(target, {"suffix": "suffix:none"}, {"code": CODE}, n_tokens=24)["suffix"]
    assert rows["all"]["tokens"] == 48 and rows["all"]["tau"] > 1.5  # each drafter's own K: up to 32
    assert sum(rows["all"]["accepted_per_round"][b] for b in ("4-7", "8-15", "16-31", "32+")) > 0
