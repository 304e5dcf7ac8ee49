"""`python -m specdec cache` (specdec/checkpoints/store.py): what is stored, with sizes, and removal that never
pulls files from under a lock another process holds. On a temporary SPECDEC_HOME with stand-in files."""

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from specdec import __main__ as main
from specdec.checkpoints import store
from specdec.checkpoints.locks import exclusive


def write(path, n):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * n)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    models = tmp_path / "models"
    write(models / "openai-community--gpt2-medium" / "model.safetensors", 3000)
    write(models / "openai-community--gpt2-medium" / "config.json", 100)
    write(models / "openai-community--gpt2-medium" / "specdec-transposed.safetensors", 2000)
    write(models / "openai-community--gpt2-medium" / ".specdec-transposed.lock", 0)
    write(models / "openai-community--gpt2" / "model.safetensors", 500)
    write(models / "openai-community--gpt2" / "model.safetensors.incomplete", 40)
    write(models / ".locks" / "openai-community--gpt2-medium" / "model.safetensors.lock", 0)
    write(models / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf", 900)
    write(tmp_path / "heads" / "medusa-355m" / "heads.json", 10)
    write(tmp_path / "heads" / "medusa-355m" / "heads-0123456789abcdef.safetensors", 700)
    return tmp_path


def run(capsys, *argv):
    code = main.main(["cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cache_lists_models_layouts_wheel_heads_and_partials_with_sizes(home, capsys):
    code, out, err = run(capsys)
    assert code == 0, err
    rows = {(line.split()[0] + " " + line.split()[1], line.split()[-3]) for line in out.splitlines()[1:-1]}
    assert ("model 355M", "3.1") in rows and ("kept layout", "2.0") in rows  # kB: 3000 + 100 bytes, 2000 bytes
    assert ("model 124M", "500") in rows and ("partial download", "40") in rows
    assert ("wheel model", "900") in rows and ("trained heads", "710") in rows
    assert out.startswith(f"specdec stores 7.2 kB under {home}")


def test_remove_never_takes_what_another_process_holds(home, capsys):
    lock = home / "models" / ".locks" / "openai-community--gpt2-medium" / "model.safetensors.lock"
    with exclusive(lock) as held:  # a download of 355M in progress (flock: another open file conflicts)
        assert held
        code, out, err = run(capsys, "--remove", "gpt2-medium")
        assert code == 1 and "nothing removed" in err and "held by another process" in err
        assert (home / "models" / "openai-community--gpt2-medium" / "model.safetensors").is_file()
    code, out, err = run(capsys, "--remove", "gpt2-medium")  # the Hub's name for 355M
    assert code == 0 and "removed 355M" in out, err
    assert not (home / "models" / "openai-community--gpt2-medium").exists()
    assert lock.is_file()  # lock files stay (a new one under the old name would let two processes in)
    assert (home / "models" / "openai-community--gpt2" / "model.safetensors").is_file()  # others untouched


def test_remove_a_held_layout_is_skipped_and_the_rest_removed(home, capsys):
    write(home / "models" / "openai-community--gpt2" / "specdec-transposed.safetensors", 300)
    with exclusive(home / "models" / "openai-community--gpt2-medium" / ".specdec-transposed.lock"):
        code, out, err = run(capsys, "--remove-layouts")
    assert code == 1 and "kept 355M" in err and "removed the kept layout of 124M" in out
    assert (home / "models" / "openai-community--gpt2-medium" / "specdec-transposed.safetensors").is_file()
    code, out, err = run(capsys, "--remove_layouts")
    assert code == 0 and not list((home / "models").rglob("specdec-transposed.safetensors"))
    assert (home / "models" / "openai-community--gpt2-medium" / "model.safetensors").is_file()


def test_remove_heads_and_unknown_names(home, capsys):
    assert run(capsys, "--remove", "heads/medusa-355m")[0] == 0 and not (home / "heads" / "medusa-355m").exists()
    code, _, err = run(capsys, "--remove", "774M")
    assert code == 1 and "nothing stored under the name '774M'" in err and "355M" in err


HOLD = """import pathlib, sys, time
from specdec.checkpoints.locks import exclusive
with exclusive(pathlib.Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_lock_held_by_another_process(home):
    """The lock as another process holds it: a child process takes it and waits."""
    lock = home / "models" / ".locks" / "openai-community--gpt2-medium" / "model.safetensors.lock"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(store.InUse):
            store.remove("355M", home)
    finally:
        child.kill()
        child.wait()
    time.sleep(0.1)
    assert [e.name for e in store.remove("355M", home)] == ["355M"]


def test_help_states_download_and_kept_layout(capsys):
    with pytest.raises(SystemExit):
        main.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the default pair is a 2.1 GB download plus 1.5 GB of kept layout" in text and "cache" in text
