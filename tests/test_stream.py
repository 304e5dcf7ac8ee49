"""Streaming and progress in `python -m specdec`: text as it is decided (coloured by kind on a terminal only), a
status line on standard error, --json silent on standard output until the end, Ctrl-C prints what was measured."""

import importlib
import io
import json

import pytest

from specdec.cli import main

race_module = importlib.import_module("specdec.race")  # (specdec.race is also the function's name)

OFFLINE = [
    "--target_model_size",
    "stdlib-6L",
    "--draft",
    "stdlib-2L",
    "--prompt",
    "def parse(line):",
    "--n_tokens_to_generate",
    "8",
    "--no_warmup",
]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_json_keeps_stdout_for_the_json_and_reports_progress_on_stderr(capsys):
    assert main.main([*OFFLINE, "--json", "--repeats", "2"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)  # the whole of stdout is one JSON object
    assert report["interrupted"] is None and len(report["summary"]["speedups"]) == 2
    assert "(measuring the forward-pass costs" in err and "(timing repeat 2 of 2: speculative)" in err


def test_text_streams_both_decoders_and_status_goes_to_stderr(capsys):
    assert main.main([*OFFLINE, "--repeats", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.count("def parse(line):") == 3  # the prompt line, then each decoder's streamed text
    assert out.index("── autoregressive") < out.index("── speculative") < out.index("── summary")
    assert "(timing repeat 1 of 1: speculative)" in err and "measuring" not in out


def test_a_terminal_gets_colours_and_a_status_line_rewritten_in_place(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert main.main([*OFFLINE, "--repeats", "1", "--K", "3"]) == 0
    text = terminal.getvalue()
    assert "\033[32m" in text or "\033[33m" in text  # a draft token (green) or a correction (yellow)
    assert "legend:" in text
    status = main.Status(Terminal())
    status("measuring")
    status("warming up")
    status.clear()
    assert status.out.getvalue() == "\r\033[K(measuring)\r\033[K(warming up)\r\033[K"


def interrupt_on_call(monkeypatch, name: str, n: int):
    """Make race's `name` raise KeyboardInterrupt on its n-th call, as Ctrl-C would."""
    inner, calls = getattr(race_module, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return inner(*args, **kwargs)

    monkeypatch.setattr(race_module, name, wrapped)


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_prints_what_was_measured_and_exits_130(monkeypatch, capsys, as_json):
    interrupt_on_call(monkeypatch, "decode_speculative", 2)  # repeat 1 finishes, repeat 2 is cut short
    code = main.main([*OFFLINE, "--repeats", "3", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 130
    assert "interrupted while timing repeat 2 of 3" in err and "what was measured so far" in err
    if as_json:
        report = json.loads(out)
        assert report["interrupted"].startswith("timing repeat 2") and len(report["summary"]["speedups"]) == 1
    else:
        assert "── summary" in out and "1 repeat: no spread measured" in out


def test_ctrl_c_while_measuring_says_nothing_was_timed(monkeypatch, capsys):
    interrupt_on_call(monkeypatch, "setup", 1)  # the race's set-up, which times the costs
    assert main.main(OFFLINE) == 130
    out, err = capsys.readouterr()
    assert "interrupted while measuring the costs; nothing was timed yet" in err and "summary" not in out
