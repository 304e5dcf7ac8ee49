"""Strict flags (specdec/flags.py) across `python -m specdec`, `python -m specdec.bench` and `python -m specdec.train`:
no abbreviations, both spellings, a flag that contradicts the others refused with one line, a redundant one accepted
with a note, and where a prompt comes from."""

import io
import subprocess
import sys

import pytest
from conftest import ROOT

from specdec.cli import main
from specdec.cli import flags
from specdec.bench import speed, suite, trees
from specdec.cli import defaults
from specdec.train import cli as train_cli

OFFLINE = ["--target_model_size", "stdlib-6L", "--draft", "ngram"]  # shipped: nothing to download


def refused(capsys, parse, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_no_abbreviations(capsys):
    # `--k 2` used to be read as `--k_max 2` while the header still said K=4.
    assert "unrecognized arguments: --k" in refused(capsys, main.parse_args, [*OFFLINE, "--k", "2"])
    assert "--n_tok" in refused(capsys, main.parse_args, [*OFFLINE, "--n_tok", "5"])


def test_both_spellings_are_one_flag_and_help_shows_one(capsys):
    a = main.parse_args([*OFFLINE, "--k-max", "6", "--K", "auto", "--n-tokens-to-generate", "7", "--models-dir=x"])
    b = main.parse_args([*OFFLINE, "--k_max", "6", "--K", "auto", "--n_tokens_to_generate", "7", "--models_dir=x"])
    assert (
        (a.k_max, a.n_tokens_to_generate, a.models_dir)
        == (b.k_max, b.n_tokens_to_generate, b.models_dir)
        == (6, 7, "x")
    )
    assert flags.given(a) == flags.given(b) >= {"k_max", "K", "n_tokens_to_generate", "models_dir"}
    # bench and train declared dashes; underscores work there too
    assert (
        speed.parse_args(["--drafter_tokens", "9"]).drafter_tokens
        == speed.parse_args(["--drafter-tokens", "9"]).drafter_tokens
        == 9
    )
    assert suite.parse_args(["--n_tokens", "5"]).n_tokens == 5 and trees.main  # (trees parses inside main)
    with pytest.raises(SystemExit):
        main.parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert "--k_max" in help_text and "--k-max" not in help_text


def test_a_value_after_double_dash_is_not_a_flag():
    p = flags.Parser(prog="t")
    p.add_argument("--seq-len", type=int)
    p.add_argument("rest", nargs="*")
    args = p.parse_args(["--seq_len", "3", "--", "--seq_len"])
    assert args.seq_len == 3 and args.rest == ["--seq_len"]


@pytest.mark.parametrize(
    "argv,why",
    [
        (["--k_max", "2"], "--k_max 2 is below --K 4"),
        (["--k-max", "3", "--K", "5"], "--k_max 3 is below --K 5"),
        (["--ngram_max", "4", "--draft", "stdlib-2L"], "--ngram_max only applies to --draft ngram"),
        (["--ngram_max", "4", "--draft", "ngram:2"], "both set the n-gram length"),
        (["--prompt_lookup_min", "2", "--draft", "stdlib-2L"], "for --draft ngram or ngram+X"),
        (["--draft_min", "4", "--draft", "ngram"], "--prompt_lookup_min must be 1..3"),
        (["--prompt_lookup_min", "1", "--draft", "ngram:2..3"], "both set the shortest n-gram"),
        (["--verification", "traversal", "--only", "speculative"], "'traversal' judges trees"),
        (
            ["--verification", "spectr", "--tree", "4", "--temperature", "1"],
            "'spectr' needs a tree's siblings drawn i.i.d.",
        ),
        (["--verification", "spectr", "--tree", "4", "--temperature", "1", "--draft", "stdlib-2L"], "(--siblings iid)"),
        (["--verification", "traversal", "--temperature", "1"], "'traversal' judges trees: pass tree=N (--tree N)"),
        (["--verification", "block", "--tree", "4"], "'block' judges a chain jointly"),
        (["--verification", "spectr", "--siblings", "iid", "--draft", "stdlib-2L"], "'spectr' judges trees"),
        (
            ["--verification", "traversal", "--tree", "4", "--temperature", "1", "--batch", "2", "--prompt_file", "p"],
            "--batch drafts chains",
        ),
        (["--siblings", "iid", "--temperature", "1", "--draft", "stdlib-2L"], "--siblings shapes a tree's children"),
        (["--siblings", "iid", "--tree", "4", "--temperature", "1"], "--siblings only applies to a draft model"),
        (["--siblings", "iid", "--draft", "stdlib-2L"], "--siblings shapes a tree's children"),
        (["--prompt", "a", "--prompt_file", "b"], "give the prompt once"),
        (["--prompt_file", "/nonexistent/prompt.txt"], "no such file"),
    ],
)
def test_a_flag_that_contradicts_the_others_is_refused(argv, why, capsys):
    base = ["--target_model_size", "stdlib-6L"] + ([] if "--draft" in argv else ["--draft", "ngram"])
    assert why in refused(capsys, main.parse_args, [*base, *argv])


ONLY_AR = ["--only", "autoregressive"]
SPECTR_AT_0 = ["--verification", "spectr", "--tree", "4", "--siblings", "iid", "--draft", "stdlib-2L"]


@pytest.mark.parametrize(
    "argv,why,used",
    [
        (["--k_max", "6"], "--k_max only bounds --K auto or adaptive, and --K is 4", {"k_max": 8}),
        (["--k-max", "6", "--K", "5"], "and --K is 5", {"k_max": 8, "K": 5}),
        (["--top_k", "40"], "--top_k has no effect at temperature 0", {"top_k": None}),
        (["--top_p", "0.9"], "--top_p has no effect at temperature 0", {"top_p": None}),
        (["--seed", "3"], "--seed has no effect at temperature 0", {"seed": 0}),
        (["--ngram_max", "4", "--draft", "ngram:4"], "--ngram_max repeats the n-gram length of --draft ngram:4", {}),
        ([*ONLY_AR, "--K", "3"], "--K is about the speculative decoder, which --only autoregressive", {"K": 4}),
        ([*ONLY_AR, "--draft", "ngram"], "which --only autoregressive does not run", {}),
        ([*ONLY_AR, "--verification", "block"], "--only autoregressive", {"verification": "token"}),
        ([*ONLY_AR, "--draft_confidence", "0.3"], "--only autoregressive", {"draft_confidence": None}),
        (SPECTR_AT_0, "--verification has no effect at temperature 0", {"verification": "token", "siblings": None}),
        (SPECTR_AT_0[2:], "--siblings has no effect at temperature 0", {"siblings": None}),
    ],
)
def test_a_redundant_flag_is_accepted_with_a_note(argv, why, used, capsys):
    """A flag that changes nothing in this run (--seed at temperature 0, the value --draft ngram:4 already gives)
    must not break a script: one note per flag on standard error, nothing on standard output, and the run uses
    what it would have used without the flag."""
    base = ["--target_model_size", "stdlib-6L"] + ([] if "--draft" in argv else ["--draft", "ngram"])
    args = main.parse_args([*base, *argv])
    out, err = capsys.readouterr()
    assert out == "" and why in err and all(line.startswith("specdec: note: ") for line in err.splitlines()), err
    assert {dest: getattr(args, dest) for dest in used} == used


def test_the_same_flags_are_accepted_where_they_mean_something():
    args = main.parse_args(
        [
            *OFFLINE,
            "--K",
            "adaptive",
            "--k_max",
            "6",
            "--temperature",
            "0.8",
            "--top_k",
            "40",
            "--top_p",
            "0.9",
            "--seed",
            "3",
        ]
    )
    assert (args.k_max, args.top_k, args.top_p, args.seed) == (6, 40, 0.9, 3)
    args = main.parse_args(["--target_model_size", "stdlib-6L", "--draft", "ngram", "--ngram_max", "5"])
    assert args.draft_spec.arg == 5
    for draft in ("stdlib-2L", "early_exit:2"):
        args = main.parse_args(
            [
                "--target_model_size",
                "stdlib-6L",
                "--draft",
                draft,
                "--tree",
                "8",
                "--temperature",
                "1",
                "--verification",
                "spectr",
                "--siblings",
                "iid",
            ]
        )
        assert (args.verification, args.siblings) == ("spectr", "iid")
    args = main.parse_args([*OFFLINE, "--tree", "8", "--temperature", "1", "--verification", "traversal"])
    assert args.verification == "traversal" and args.siblings is None


def test_the_prompt_from_stdin_and_from_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("naïve\nsecond line\n".encode())))
    assert main.parse_args([*OFFLINE, "--prompt", "-"]).prompt == "naïve\nsecond line"
    path = tmp_path / "prompt.txt"
    path.write_bytes("\ufeffdef parse(line):\n    return".encode() + b"\n")
    assert main.parse_args([*OFFLINE, "--prompt_file", str(path)]).prompt == "def parse(line):\n    return"
    assert main.parse_args(OFFLINE).prompt == defaults.GPT2_PROMPT  # a named model: GPT-2's prompt
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ValueError, match="not UTF-8"):
        flags.read_prompt(None, str(path))


def test_prompt_dash_through_the_shell():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdec",
            *OFFLINE,
            "--prompt",
            "-",
            "--n_tokens_to_generate",
            "3",
            "--no_warmup",
            "--only",
            "speculative",
            "--json",
        ],
        input="def parse(line):\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"prompt": "def parse(line):"' in proc.stdout


def test_train_takes_both_spellings_and_no_abbreviations(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_cli.main(["medusa", "--model", "x", "--tokens", "10", "--out", "o", "--seq"])
    assert exit_.value.code == 2 and "unrecognized arguments: --seq" in capsys.readouterr().err
    # --seq_len (underscore) reaches check_settings, which refuses the value: the flag itself was understood
    code = train_cli.main(["medusa", "--model", "x", "--tokens", "10", "--out", "o", "--seq_len", "0"])
    assert code == 2 and "seq_len" in capsys.readouterr().err.replace("-", "_")


def test_train_refuses_heads_for_eagle(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_cli.main(["eagle", "--model", "x", "--tokens", "10", "--out", "o", "--heads", "3"])
    assert exit_.value.code == 2 and "--heads only applies to medusa" in capsys.readouterr().err


def test_one_note_per_redundant_flag(capsys):
    """--k_max with --only autoregressive and a fixed K is redundant twice over: one note, its first reason."""
    args = main.parse_args([*OFFLINE, *ONLY_AR, "--K", "3", "--k_max", "6", "--seed", "2"])
    notes = capsys.readouterr().err.splitlines()
    assert [note.split()[2] for note in notes] == ["--seed", "--draft_model_size", "--K", "--k_max"], notes
    assert "--only autoregressive" in notes[3] and (args.K, args.k_max, args.seed) == (4, 8, 0)
