"""The command line: main.py end to end on tiny checkpoints (local folders and a loopback Hub), and its errors."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, TINY_HPARAMS, tiny_model, write_checkpoint
from helpers import near_tie_model, perturbed

sys.path.insert(0, str(ROOT))
from specdec.cli import main  # noqa: E402
from specdec.config import check_request


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = tiny_model(seed=1)
    write_checkpoint(root / "target", target)
    write_checkpoint(root / "draft", perturbed(target, 0.05, seed=4))
    return root


def run_main(capsys, *argv):
    code = main.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_race_prints_both_decoders_and_a_summary(checkpoints, capsys):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        str(checkpoints / "draft"),
        "--prompt",
        "the cat in the hat",
        "--n_tokens_to_generate",
        "24",
        "--K",
        "3",
    )
    assert code == 0, err
    assert "── autoregressive" in out and "── speculative" in out and "── summary" in out
    assert out.split("identical text at temperature 0")[1].split()[0] == "yes"
    assert "\033[" not in out  # captured stdout is not a terminal: no colour codes
    for key in (
        "speedup",
        "alpha (accepted / judged drafts)",
        "tau (tokens per round",
        "predicted speedup",
        "drafting",
    ):
        assert key in out


def test_json_output(checkpoints, capsys):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        str(checkpoints / "draft"),
        "--prompt",
        "in the",
        "--n_tokens_to_generate",
        "20",
        "--json",
        "--repeats",
        "2",
    )
    assert code == 0, err
    report = strict_json(out)
    ar, spec = report["autoregressive"], report["speculative"]
    assert ar["tokens"] == spec["tokens"] and len(ar["tokens"]) == 20
    assert report["summary"]["texts_identical"] is True
    assert len(spec["seconds_all_repeats"]) == 2
    assert spec["accepted"] <= spec["drafted"] and sum(spec["accepted_histogram"]) == spec["rounds"]
    assert report["costs"]["r"][0] == 1.0


def test_the_prompt_is_checked_once_per_run(checkpoints, capsys, monkeypatch):
    """The command line checks the request before loading the draft and hands it to the race, which
    takes its prompt as it is (request.check_request encodes the text and applies any chat template)."""
    from specdec import config as request

    checks = []
    monkeypatch.setattr(request, "check_request", lambda *a, **kw: checks.append(a[1]) or check_request(*a, **kw))
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        "ngram",
        "--prompt",
        "the cat",
        "--n_tokens_to_generate",
        "6",
        "--repeats",
        "2",
        "--json",
    )
    assert code == 0, err
    assert len(json.loads(out)["speculative"]["tokens"]) == 6
    assert checks == ["the cat"], f"the prompt was checked {len(checks)} times in one run"


@pytest.mark.parametrize("draft", ["ngram", "early_exit:1"])
def test_model_free_drafters(checkpoints, capsys, draft):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        draft,
        "--prompt",
        "the the the the",
        "--n_tokens_to_generate",
        "16",
        "--K",
        "adaptive",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["summary"]["texts_identical"] is True
    assert report["speculative"]["drafted"] > 0


@pytest.mark.parametrize(
    "verification,siblings", [("spectr", "iid"), ("traversal", "iid"), ("traversal", "without_replacement")]
)
def test_the_tree_rules_from_the_command_line(checkpoints, capsys, verification, siblings):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        str(checkpoints / "draft"),
        "--n_tokens_to_generate",
        "10",
        "--temperature",
        "1",
        "--tree",
        "4",
        "--K",
        "2",
        "--verification",
        verification,
        "--siblings",
        siblings,
        "--only",
        "speculative",
        "--repeats",
        "1",
        "--no_warmup",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    settings = report["settings"]
    assert (settings["verification"], settings["siblings"]) == (verification, siblings.replace("_", " "))
    assert len(report["speculative"]["tokens"]) == 10 and report["speculative"]["drafted"] > 0


def test_sampling_with_auto_k_runs_one_decoder(checkpoints, capsys):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        str(checkpoints / "draft"),
        "--n_tokens_to_generate",
        "12",
        "--temperature",
        "0.9",
        "--top_k",
        "50",
        "--top_p",
        "0.95",
        "--K",
        "auto",
        "--only",
        "speculative",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    assert "autoregressive" not in report and len(report["speculative"]["tokens"]) == 12


def test_download_through_a_loopback_hub(fake_hub, tmp_path, capsys):
    target = tiny_model(seed=1)
    fake_hub.add_checkpoint("org/tiny-target", write_checkpoint(tmp_path / "t", target))
    fake_hub.add_checkpoint("org/tiny-draft", write_checkpoint(tmp_path / "d", perturbed(target, 0.05, seed=4)))
    models = tmp_path / "models"
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        "org/tiny-target",
        "--draft",
        "org/tiny-draft",
        "--models_dir",
        str(models),
        "--n_tokens_to_generate",
        "8",
        "--json",
    )
    assert code == 0, err
    assert (models / "org--tiny-target" / "model.safetensors").is_file()
    assert json.loads(out)["summary"]["texts_identical"] is True


def test_every_model_the_command_line_loads_gets_this_machine_s_threads(checkpoints, capsys, monkeypatch):
    """GPT-2 folders are read by the command line itself (not load_model): they get the plan too."""
    from specdec.model.fast import tuning

    tuned = []
    monkeypatch.setattr(tuning, "tune", lambda model, folder, say=None: tuned.append(model.name) or {})
    target, draft = str(checkpoints / "target"), str(checkpoints / "draft")
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        target,
        "--draft",
        draft,
        "--n_tokens_to_generate",
        "3",
        "--repeats",
        "1",
        "--json",
    )
    assert code == 0, err
    assert tuned == [target, draft]


def test_errors_are_one_line(checkpoints, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = str(checkpoints / "target")
    # Errors that need the model (or the network) to be found: one line; exit 2 for a request the
    # loaded model refuses (bad input, as a bad flag), 1 for the rest.
    cases = [
        (
            [
                "--target_model_size",
                target,
                "--draft",
                "124M",
                "--models_dir",
                str(tmp_path),
                "--n_tokens_to_generate",
                "5",
            ],
            1,
            "HF_HUB_OFFLINE",
        ),
        (["--target_model_size", target, "--draft", "ngram", "--n_tokens_to_generate", "500"], 2, "context window"),
        (["--target_model_size", target, "--draft", "early_exit:7", "--n_tokens_to_generate", "5"], 1, "early exit"),
        (["--target_model_size", target, "--draft", "ngram", "--prompt", "the " * 40], 2, "shorten the prompt"),
    ]
    for argv, expected, message in cases:
        code, out, err = run_main(capsys, *argv)
        assert code == expected, err
        assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--K", "0"], "--K must be at least 1"),
        (["--K", "lots"], "--K must be an integer"),
        (["--K", "200"], "--K must be at most 32"),
        (["--temperature", "-1"], "temperature"),
        (["--top_p", "1.5"], "top_p"),
        (["--top_p", "0"], "top_p"),
        (["--top_k", "0"], "top_k"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--draft", "foo"], "unknown model"),
        (["--target_model_size", "999M"], "unknown model"),
        (["--draft", "ngram:abc"], "ngram:N"),
        (["--draft", "early_exit:x"], "early_exit:L"),
        (["--temperature", "hot"], "invalid float"),
        (["--n_tokens_to_generate", "0"], "n_tokens_to_generate must be >= 1"),
        (["--bogus"], "unrecognized arguments"),
        (["--only", "neither"], "invalid choice"),
    ],
)
def test_bad_flags_exit_2_with_one_line_before_any_download(argv, message, fake_hub, tmp_path, capsys):
    # fake_hub points HF_ENDPOINT at a loopback server that records every request.
    with pytest.raises(SystemExit) as exit_:
        main.main(["--models_dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert fake_hub.requests == [] and list(tmp_path.iterdir()) == [], "nothing is fetched or written"


def test_a_bad_specdec_kernels_exits_2_with_one_line_before_any_download(fake_hub, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_KERNELS", "fastest")
    with pytest.raises(SystemExit) as exit_:
        main.main(["--models_dir", str(tmp_path), "--draft", "ngram"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "SPECDEC_KERNELS must be one of plan, measure, rules, plain" in err and len(err.strip().splitlines()) == 1, (
        err
    )
    assert fake_hub.requests == [] and list(tmp_path.iterdir()) == [], "nothing is fetched or written"


def test_a_bad_flag_from_the_shell_is_one_line_without_a_traceback():
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--K", "0"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.strip() == "main.py: error: --K must be at least 1 (it is the number of draft tokens per round), "
        "got 0 (see --help)"
    )


def test_a_models_dir_that_cannot_be_a_folder_is_bad_input(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    (tmp_path / "a_file").write_text("not a folder")
    cases = [("/dev/null/models", "lies inside /dev/null, which is not a folder"), (str(tmp_path / "a_file"), "")]
    for models_dir, why in cases:
        with pytest.raises(SystemExit) as exit_:
            main.main(["--target_model_size", "124M", "--models_dir", models_dir])
        out, err = capsys.readouterr()
        assert exit_.value.code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert f"--models_dir {models_dir} {why or 'is not a folder'}: give a folder" in err


def strict_json(text):
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))


def test_json_is_strict_when_nothing_is_drafted(checkpoints, capsys):
    # One token: no round drafts, so alpha is undefined (null, not NaN).
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        "ngram:5",
        "--prompt",
        "xyz",
        "--n_tokens_to_generate",
        "1",
        "--json",
    )
    assert code == 0, err
    report = strict_json(out)
    assert report["speculative"]["alpha"] is None and report["speculative"]["drafted"] == 0
    assert report["settings"]["draft"] == "ngram:5"


def test_wide_k_and_self_draft(checkpoints, capsys):
    target = str(checkpoints / "target")
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        target,
        "--draft",
        target,
        "--K",
        "12",
        "--prompt",
        "in the",
        "--n_tokens_to_generate",
        "20",
    )
    assert code == 0, err
    assert "nan" not in out and "(the target itself)" in out
    assert "K=12" in out and "target pass over k+1=" in out


def test_a_long_prompt_is_echoed_shortened(checkpoints, capsys):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        "ngram",
        "--prompt",
        "in the " * 5,
        "--n_tokens_to_generate",
        "4",
    )
    assert code == 0, err
    assert "(1 tokens)" not in out and "(1 layers" not in out
    long_prompt = "x" * 1000
    assert len(main.shorten(long_prompt)) < 400 and main.shorten("short") == "short"


def test_float64_runs_the_target_in_float64_and_greedy_texts_agree_on_near_ties(tmp_path, capsys, monkeypatch):
    """--float64: the target main.py races is float64 (the draft stays float32), and on a model whose
    two best tokens always lie within 1e-5 greedy speculative output equals autoregressive output."""
    model = near_tie_model(hparams=TINY_HPARAMS)
    write_checkpoint(tmp_path / "target", model)
    write_checkpoint(tmp_path / "draft", model)
    dtypes = []

    def spy(target, draft, *args, **kwargs):
        dtypes.append((target.dtype, draft.dtype))
        return race(target, draft, *args, **kwargs)

    race = main.race
    monkeypatch.setattr(main, "race", spy)

    def identical(k, draft, *flags):
        code, out, err = run_main(
            capsys,
            "--target_model_size",
            str(tmp_path / "target"),
            "--draft",
            str(tmp_path / draft),
            "--prompt",
            "the hat",
            "--n_tokens_to_generate",
            "30",
            "--K",
            k,
            "--no_warmup",
            *flags,
        )
        assert code == 0, err
        assert (", float64)" in out.split("target:")[1].splitlines()[0]) == ("--float64" in flags)
        return out.split("identical text at temperature 0")[1].split()[0]

    assert identical("3", "draft") == "NO:", "the control: in float32 the near-ties make the texts differ"
    assert [identical(k, "draft", "--float64") for k in ("1", "3", "5")] == ["yes"] * 3
    assert identical("3", "target", "--float64") == "yes", "the target drafting for itself"
    assert dtypes == [(np.float32, np.float32)] + [(np.float64, np.float32)] * 4, "the draft stays float32"


@pytest.mark.slow  # a 60-token SmolLM2 race
def test_chat_on_smollm2_prints_the_reply_and_a_race(smollm2_gguf, tmp_path):
    """The first run a user sees: a chat request to the real model, drafted by prompt lookup."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "--target_model_size",
            str(smollm2_gguf),
            "--draft",
            "ngram",
            "--chat",
            "--prompt",
            "What is the capital of France?",
            "--n_tokens_to_generate",
            "30",
            "--no_warmup",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("The capital of France is Paris.\n") == 2  # both decoders, same reply
    assert "<|im_end|>" not in proc.stdout  # the token ending the reply is not text
    assert re.search(r"identical text at temperature 0 +yes", proc.stdout)
    refused = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "--target_model_size",
            "stdlib-6L",
            "--draft",
            "ngram",
            "--chat",
            "--prompt",
            "hi",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert (
        refused.returncode == 2 and "--chat needs a chat model" in refused.stderr and "Traceback" not in refused.stderr
    )


@pytest.mark.parametrize("bar", ["0.3", "auto"])
def test_a_draft_confidence_bar_from_the_command_line(checkpoints, capsys, bar):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        str(checkpoints / "draft"),
        "--prompt",
        "the cat",
        "--n_tokens_to_generate",
        "16",
        "--K",
        "4",
        "--draft_confidence",
        bar,
        "--repeats",
        "1",
        "--no_warmup",
    )
    assert code == 0, err
    assert out.split("identical text at temperature 0")[1].split()[0] == "yes"
    line = next(x for x in out.splitlines() if x.startswith("draft confidence bar"))
    shown = float(line.split("  ")[-2].split()[-1])
    assert (0 < shown <= 1) and (shown == 0.3 or bar == "auto") and ("set by the costs" in line) == (bar == "auto")
    assert "best K" not in out and "tau expected" not in out  # eq. 1 on the sure drafts' alpha would overstate


def test_lookup_first_from_the_command_line(checkpoints, capsys):
    code, out, err = run_main(
        capsys,
        "--target_model_size",
        str(checkpoints / "target"),
        "--draft",
        "ngram+early_exit:1",
        "--prompt",
        "the cat sat on the mat and the cat sat on the",
        "--n_tokens_to_generate",
        "16",
        "--K",
        "4",
        "--draft_confidence",
        "auto",
        "--repeats",
        "1",
        "--no_warmup",
    )
    assert code == 0, err
    assert "n-gram lookup (2 <= n <= 3), else the target's first 1 layer" in out
    assert out.split("identical text at temperature 0")[1].split()[0] == "yes"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--draft", "ngram+124M"], "not a model name"),
        (["--draft", "ngram+early_exit:1", "--ngram_max", "4"], "only applies to --draft ngram"),
        (["--draft", "ngram+early_exit:1", "--siblings", "iid", "--tree", "4"], "only applies to a draft model"),
        (["--draft", "ngram+early_exit:1", "--batch", "2", "--prompt_file", __file__], "ngram+eagle"),
    ],
)
def test_a_lookup_first_spec_it_cannot_run_is_refused(checkpoints, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main.main(["--target_model_size", str(checkpoints / "target"), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_layers_after_the_lookup_are_checked_by_the_target_s_name(capsys):
    with pytest.raises(SystemExit) as exit_:  # before anything loads: stdlib-6L's 6 layers are known by name
        main.main(["--target_model_size", "stdlib-6L", "--draft", "ngram+early_exit:6", "--prompt", "x"])
    assert exit_.value.code == 2 and "L < 6" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--draft", "ngram", "--draft_confidence", "0.3"], "proposes certain tokens"),
        (["--draft_confidence", "0.3", "--tree", "4"], "tree is already grown"),
        (["--draft_confidence", "auto", "--tree", "4"], "tree is already grown"),
        (["--draft_confidence", "1.5"], "(0, 1] or 'auto'"),
    ],
)
def test_a_draft_confidence_bar_is_refused_where_it_would_do_nothing(checkpoints, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main.main(["--target_model_size", str(checkpoints / "target"), "--draft", str(checkpoints / "draft"), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
