"""main.py where its output goes somewhere awkward: a closed pipe, a non-UTF-8 terminal, Ctrl-C at start-up."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT, tiny_model, write_checkpoint

MAIN = str(ROOT / "main.py")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return str(write_checkpoint(tmp_path_factory.mktemp("models") / "target", tiny_model(seed=1)))


def env(**extra):
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def test_a_closed_pipe_ends_the_run_quietly(target):
    """`main.py ... | head -1` where head has already gone: no "Broken pipe" error and no traceback."""
    proc = subprocess.Popen(
        [
            sys.executable,
            MAIN,
            "--target_model_size",
            target,
            "--draft",
            "ngram",
            "--prompt",
            "the cat",
            "--n_tokens_to_generate",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
        cwd=ROOT,
    )
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert err == "" and proc.returncode == 141, (proc.returncode, err)


def test_a_terminal_that_is_not_utf8_gets_replacement_characters(target):
    proc = subprocess.run(
        [
            sys.executable,
            MAIN,
            "--target_model_size",
            target,
            "--draft",
            "ngram",
            "--prompt",
            "naïve café ü",
            "--n_tokens_to_generate",
            "5",
        ],
        capture_output=True,
        env=env(PYTHONIOENCODING="ascii"),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"na?ve caf? ?" in proc.stdout


_INTERRUPT_IMPORT = """
import runpy, sys
class CtrlC:  # Ctrl-C arriving while numpy is imported
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = [sys.argv[1], "--help"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_ctrl_c_during_start_up_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_IMPORT, MAIN], capture_output=True, env=env(), cwd=ROOT)
    assert proc.returncode == 130
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
