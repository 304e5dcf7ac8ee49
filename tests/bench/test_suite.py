"""specdec.bench.suite, .alpha and .prompts: the prompt suite, the per-category benchmark and the alpha table,
on tiny checkpoints with a tiny tokenizer (the real runs need real weights)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SHARED_TOKENIZER, TINY_HPARAMS, tiny_model, write_checkpoint

from specdec.bench import suite, tally
from specdec.bench.alpha import alpha_table, beta
from specdec.bench.prompts import load_prompts
from specdec.checkpoints.load import load_folder

HPARAMS = dataclasses.replace(TINY_HPARAMS, n_ctx=512)  # the suite's prompts are a few hundred bytes
CATEGORIES = {"copy", "code", "continuation", "lists", "dialogue"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    small = dataclasses.replace(HPARAMS, n_layer=1)
    return {
        "big": write_checkpoint(root / "big", tiny_model(seed=0, hparams=HPARAMS)),
        "small": write_checkpoint(root / "small", tiny_model(seed=1, hparams=small)),
        "twin": write_checkpoint(root / "twin", tiny_model(seed=0, hparams=HPARAMS)),  # the same weights as big
    }


def one_per_category(n: int = 1) -> dict[str, list[str]]:
    return {cat: prompts[:n] for cat, prompts in load_prompts().items()}


def test_the_committed_suite():
    prompts = load_prompts()
    assert set(prompts) == CATEGORIES
    assert all(len(ps) >= 4 for ps in prompts.values())
    assert len({p for ps in prompts.values() for p in ps}) == sum(map(len, prompts.values()))  # no duplicates
    if (SHARED_TOKENIZER / "vocab.json").is_file():  # with GPT-2's tokenizer: every prompt leaves room to generate
        from specdec.model.tokenizer import load_tokenizer

        enc = load_tokenizer(SHARED_TOKENIZER / "vocab.json", SHARED_TOKENIZER / "merges.txt")
        assert max(len(enc.encode(p)) for ps in prompts.values() for p in ps) < 128


@pytest.mark.parametrize(
    "content, message",
    [("{}", "expected"), ('{"categories": {"a": {"prompts": []}}}', "at least one"), ("[1]", "expected")],
)
def test_a_bad_prompt_file_is_refused(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_prompts(path)


def test_beta_by_hand():
    p = np.log(np.array([[0.5, 0.5, 0.0001], [0.9, 0.05, 0.05]], dtype=np.float32))
    q = np.log(np.array([[0.5, 0.0001, 0.5], [0.2, 0.7, 0.1]], dtype=np.float32))
    np.testing.assert_allclose(beta(p, q, 1.0), [0.5, 0.2 + 0.05 + 0.05], atol=1e-3)
    assert beta(p, q, 0.0).tolist() == [1.0, 0.0]  # argmax 0 (a tie: the first) vs 0; 0 vs 1
    assert beta(p, p, 0.7) == pytest.approx([1.0, 1.0], abs=1e-6)


def test_alpha_table_pairs_and_values(folders):
    models = {name: load_folder(folder, name=name) for name, folder in folders.items()}
    prompts = {"lists": load_prompts()["lists"][:2]}
    table = alpha_table(models.__getitem__, ["small", "twin", "big"], prompts, (0.0, 1.0), n_tokens=6)
    pairs = [(row["draft"], row["target"]) for row in table]
    assert pairs == [("small", "twin"), ("small", "big"), ("twin", "big")]
    alpha = {pair: row["alpha"] for pair, row in zip(pairs, table)}
    assert alpha[("twin", "big")] == {0.0: 1.0, 1.0: pytest.approx(1.0, abs=1e-5)}  # identical weights agree
    for T in (0.0, 1.0):
        assert 0 <= alpha[("small", "big")][T] < 0.99  # an unrelated draft does not
    assert alpha[("small", "big")][0.0] * 12 == pytest.approx(round(alpha[("small", "big")][0.0] * 12))  # k / 12


def test_run_suite_rows(folders):
    target, draft = load_folder(folders["big"]), load_folder(folders["small"])
    drafts = {"small": draft, "self": target, "ngram": "ngram"}
    out = suite.run_suite(target, drafts, one_per_category(), n_tokens=8, K=3)
    assert set(out) == set(drafts)
    for label, rows in out.items():
        assert set(rows) == CATEGORIES | {"all"}
        assert rows["all"]["tokens"] == 8 * len(CATEGORIES) and rows["all"]["prompts"] == len(CATEGORIES)
        for row in rows.values():
            assert 1 <= row["tau"] <= 4 and row["speedup"] > 0
    assert out["self"]["all"]["alpha"] == 1.0 and out["self"]["all"]["tau"] == pytest.approx(8 / 2)  # 4 + 4 tokens
    assert out["small"]["all"]["alpha"] < 1
    assert out["self"]["all"]["acceptance_by_position"] == [1.0, 1.0, 1.0]  # the draft is the target: all accepted
    rounds = 2 * len(CATEGORIES)  # two rounds a prompt, each keeping its 3 drafts
    assert out["self"]["all"]["accepted_per_round"] == {
        "0": 0,
        "1": 0,
        "2-3": rounds,
        "4-7": 0,
        "8-15": 0,
        "16-31": 0,
        "32+": 0,
    }
    small = out["small"]["all"]
    assert len(small["prompt_speedups"]) == len(CATEGORIES) and all(x > 0 for x in small["prompt_speedups"])
    assert sum(small["accepted_per_round"].values()) == round(small["tokens"] / small["tau"])  # every round, once


def test_the_acceptance_length_bins():
    assert [tally.length_bin(n) for n in (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32)] == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]


def test_repeats_interleave_and_give_a_spread_and_acceptance_by_position(folders, monkeypatch):
    target, draft = load_folder(folders["big"]), load_folder(folders["small"])
    calls = []
    real_ar, real_sd = suite.autoregressive_sample, suite.speculative_sample
    monkeypatch.setattr(suite, "autoregressive_sample", lambda *a, **k: calls.append("ar") or real_ar(*a, **k))
    monkeypatch.setattr(suite, "speculative_sample", lambda *a, **k: calls.append("sd") or real_sd(*a, **k))
    prompts = {"code": load_prompts()["code"][:2]}
    out = suite.run_suite(target, {"small": draft}, prompts, n_tokens=8, K=3, repeats=3)
    assert calls[2:] == ["ar", "sd"] * 6  # (after one warm-up each) plain then speculative, prompt by prompt
    row = out["small"]["all"]
    assert row["repeats"] == 3 and row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
    assert len(row["prompt_speedups"]) == 2  # each prompt's median over its 3 repeats
    by_position = row["acceptance_by_position"]
    assert 1 <= len(by_position) <= 3 and all(0 <= a <= 1 for a in by_position)
    assert by_position[0] == row["alpha"] or len(by_position) > 1  # one judged position: its rate is alpha


def test_decoding_alone_leaves_the_prompts_pass_out_of_both(monkeypatch):
    """On a made-up clock: the prompt's pass takes 2 s; plain decoding 1 s a token; speculative decoding writes
    the same 9 tokens in 3 rounds of 1 s. End to end 10 s against 5 s (2x); after the prompt's pass, plain
    decoding wrote 8 tokens in 8 s and speculative 9 in 3 s (3x). A bench that divided the whole times only, or
    took the pass out of one side, gives something else."""
    now = [0.0]
    monkeypatch.setattr(suite.time, "perf_counter", lambda: now[0])
    result = SimpleNamespace(tokens=[1] * 9, rounds=3, accepted=6, judged=[2, 2, 2], accepted_per_round=[2, 2, 2])

    def plain(target, prompt, n_tokens, on_token=None, **settings):
        for i in range(9):
            now[0] += 2.0 if i == 0 else 1.0
            if on_token:  # the warm-up call has none
                on_token(7, "target")
        return SimpleNamespace(tokens=[7] * 9)

    def speculative(target, draft, prompt, n_tokens, **settings):
        now[0] += 2.0 + 3.0
        return result

    monkeypatch.setattr(suite, "autoregressive_sample", plain)
    monkeypatch.setattr(suite, "speculative_sample", speculative)
    row = suite.run_suite(None, {"d": "ngram"}, {"code": ["a", "b"]}, n_tokens=9, repeats=2, chat=True)["d"]["all"]
    assert row["speedup"] == pytest.approx(2.0) and row["decode_speedup"] == pytest.approx(3.0)
    assert row["prompt_speedups"] == pytest.approx([2.0, 2.0])
    assert row["prompt_decode_speedups"] == pytest.approx([3.0, 3.0])
    assert row["prompt_seconds"] == pytest.approx(4.0) and row["prompt_share"] == pytest.approx(0.2)  # 2 x 2 s of 20 s


def test_decoding_alone_compares_rates_when_the_replies_differ_in_length():
    """At T = 1 the two decoders write different replies: plain decoding 9 tokens in 10 s (its first with the
    prompt's 2 s pass), speculative decoding 5 in 4 s. Decoding alone: 8 tokens in 8 s against 5 in 2 s."""
    totals = tally.Tally()
    result = SimpleNamespace(tokens=[1] * 5, rounds=2, accepted=3, judged=[2, 2], accepted_per_round=[2, 1])
    totals.add(0, 10.0, 9, 4.0, result, 2.0)
    row = totals.row()
    assert row["speedup"] == pytest.approx((5 / 4) / (9 / 10)) and row["decode_speedup"] == pytest.approx(2.5)
    assert row["prompt_decode_speedups"] == pytest.approx([2.5])


def test_a_one_token_reply_has_no_decoding_to_time():
    totals = tally.Tally()
    totals.add(
        0, 1.0, 1, 1.0, SimpleNamespace(tokens=[5], rounds=1, accepted=0, judged=[0], accepted_per_round=[0]), 1.0
    )
    row = totals.row()
    assert row["speedup"] == 1.0 and math.isnan(row["prompt_decode_speedups"][0])


def test_chat_prompts_are_user_messages_and_rates_are_compared(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "train"))  # the tiny chat Llama lives there
    from test_distill import chat_model

    target = chat_model()
    out = suite.run_suite(target, {"ngram": "ngram"}, {"dialogue": ["Hi", "Say yes."]}, n_tokens=10, K=2, chat=True)
    row = out["ngram"]["all"]
    assert 0 < row["tokens"] <= 20 and row["speedup"] > 0


def test_suite_cli(folders, capsys, tmp_path):
    path = tmp_path / "out.json"
    argv = [
        "--target",
        str(folders["big"]),
        "--drafts",
        f"{folders['small']},ngram",
        "--n-tokens",
        "6",
        "--categories",
        "lists,dialogue",
        "--json",
        str(path),
    ]
    assert suite.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| category | ") and lines[5] == ""  # header, rule, lists, dialogue, all, then ...
    assert [line.split(" | ")[0] for line in lines[2:5]] == ["| lists", "| dialogue", "| all"]
    assert (
        lines[6]
        == "| drafts accepted in a round (share of rounds, all prompts) | 0 | 1 | 2-3 | 4-7 | 8-15 | 16-31 | 32+ |"
    )
    shares = [[int(cell.rstrip("%")) for cell in line.strip("| ").split(" | ")[1:]] for line in lines[8:10]]
    assert [line.split(" | ")[0] for line in lines[8:10]] == [f"| {folders['small']}", "| ngram"]
    assert all(98 <= sum(row) <= 102 and row[4:] == [0, 0, 0] for row in shares)  # K=4 chains: never past 4-7
    assert lines[11].startswith(f"{folders['small']}: speedup per prompt (each the median of its repeats): median ")
    n_prompts = len(load_prompts()["lists"]) + len(load_prompts()["dialogue"])
    assert lines[11].endswith(f" over {n_prompts} prompts")
    assert re.fullmatch(
        r"  by category, the median prompt \(lowest-highest\): lists [\d.]+x \([\d.]+-[\d.]+x\), dialogue [\d.]+x .*",
        lines[12],
    )
    assert lines[14].startswith(f"{folders['small']}: decoding alone per prompt (each the median of its repeats): ")
    assert lines[15].startswith("  by category, the median prompt (lowest-highest): lists ")
    assert lines[17].startswith(f"{folders['small']}: acceptance by draft position (all prompts): 1: ")
    assert re.fullmatch(
        r"the prompts' passes \(left out of decoding alone\), share of plain decoding's time: "
        r"lists [\d.]+%, dialogue [\d.]+%, all [\d.]+%",
        lines[-1],
    )
    assert set(json.loads(path.read_text())) == {str(folders["small"]), "ngram"}


def test_alpha_table_cli(folders, capsys, tmp_path):
    argv = [
        "--alpha-table",
        "--models",
        f"{folders['big']},{folders['small']}",
        "--n-tokens",
        "4",
        "--categories",
        "code",
        "--temperatures",
        "0,1",
    ]
    assert suite.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| draft -> target | T = 0 | T = 1 |"
    assert lines[2].startswith(f"| {folders['small']} -> {folders['big']} |")  # smaller drafts for larger

    assert suite.main(["--alpha-table", "--models-dir", str(tmp_path)]) == 1
    assert "needs at least two models on disk" in capsys.readouterr().err
    assert suite.main(["--alpha-table", "--models", f"{folders['big']},124M", "--models-dir", str(tmp_path)]) == 1
    assert "not on disk: 124M" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--categories", "poetry"], "unknown categories poetry"),
        (["--temperatures", "0,x"], "temperatures"),
        (["--n-tokens", "0"], "at least 1"),
        (["--K", "0"], "K must be at least 1"),
        (["--K", "many"], "K must be an integer >= 1, 'adaptive' or 'auto'"),
    ],
)
def test_bad_flags(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        suite.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_alpha_table_is_the_suites(folders, capsys):
    from specdec.bench import __main__ as bench

    argv = [
        "--only",
        "alpha-table",
        "--models",
        f"{folders['small']},{folders['twin']}",
        "--n-tokens",
        "4",
        "--categories",
        "lists",
        "--temperatures",
        "0",
    ]
    assert bench.main(argv) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith(f"| {folders['small']} -> {folders['twin']} | ") and 0 <= float(row.split("|")[2]) <= 1


def test_suite_cli_drafters_with_a_confidence_bar(folders, capsys, tmp_path):
    path = tmp_path / "out.json"
    small = str(folders["small"])
    argv = [
        "--target",
        str(folders["big"]),
        "--drafts",
        f"{small},{small}@0.5,{small}@auto",
        "--n-tokens",
        "6",
        "--categories",
        "lists",
        "--json",
        str(path),
    ]
    assert suite.main(argv) == 0
    out, err = capsys.readouterr()
    assert set(json.loads(path.read_text())) == {small, f"{small}@0.5", f"{small}@auto"}
    assert re.search(rf"{re.escape(small)}@auto: bar [0-9.]+ \(c [0-9.]+, r\(2\) [0-9.]+\)", err)
    for bad, message in (("ngram@0.5", "certain"), (f"{small}@2", "'auto'"), (f"{small}@often", "'auto'")):
        assert suite.main(["--target", str(folders["big"]), "--drafts", bad, "--n-tokens", "2"]) == 1
        assert message in capsys.readouterr().err
