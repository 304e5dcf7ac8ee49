"""The one writer and the one reader (specdec/safe_io.py): no planted name is ever written through, nothing
half-written is left, a full disk names the file, and a special file is refused at once, never read."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from conftest import within

from specdec import safe_io
from specdec.safe_io import DiskFull, Refused

needs_links = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="POSIX symbolic links")


def known_names(monkeypatch, count: int = 10_000) -> list[str]:
    """Replace the writer's random source by a known sequence; the names it will draw, in order."""
    names = [f"{i:016x}" for i in range(count)]
    draws = iter(names)
    monkeypatch.setattr(safe_io.write, "_random_name", lambda: next(draws))
    return names


def files_under(folder: Path) -> dict[str, tuple]:
    """Every entry under folder: (type, size, link target) by name, to see that nothing changed."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = (
            stat.S_IFMT(st.st_mode),
            st.st_size,
            os.readlink(p) if p.is_symlink() else None,
        )
    return out


@needs_links
def test_the_writer_never_writes_through_a_name_planted_where_it_writes(tmp_path, monkeypatch):
    """Links planted at every name the writer draws before a free one (to a file outside, to nowhere, to a
    folder): the file outside is untouched, the target is a new regular file, and the links stay links."""
    shared, outside = tmp_path / "shared", tmp_path / "outside"
    shared.mkdir()
    outside.mkdir()
    os.chmod(shared, 0o777)
    victim = outside / "victim.txt"
    victim.write_text("the user's own file\n")
    names = known_names(monkeypatch)
    target = shared / "kernel-plan-0123456789abcdef.json"
    kinds = [victim, outside / "nowhere", outside]
    for i, name in enumerate(names[: safe_io.write.TEMPORARY_TRIES - 1]):
        (shared / f".{target.name}.{name}.tmp").symlink_to(kinds[i % 3])
    outside_before = files_under(outside)

    safe_io.write_json(target, {"plans": {}})

    assert files_under(outside) == outside_before and victim.read_text() == "the user's own file\n"
    assert not target.is_symlink() and stat.S_ISREG(target.lstat().st_mode)
    assert json.loads(target.read_text()) == {"plans": {}}
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 and target.stat().st_uid == os.geteuid()
    links = [p for p in shared.iterdir() if p.is_symlink()]
    assert len(links) == safe_io.write.TEMPORARY_TRIES - 1, "every planted link is still only a link"
    assert sorted(p.name for p in shared.iterdir() if not p.is_symlink()) == [target.name], "no temporary file left"


@needs_links
def test_when_every_name_is_planted_nothing_is_written(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    target = tmp_path / "shared" / "state.json"
    target.parent.mkdir()
    target.write_text('{"old": true}\n')
    for name in known_names(monkeypatch)[: safe_io.write.TEMPORARY_TRIES]:
        (target.parent / f".{target.name}.{name}.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError, match="all taken"):
        safe_io.write_json(target, {"new": True})
    assert victim.read_text() == "mine\n" and json.loads(target.read_text()) == {"old": True}


@needs_links
def test_a_link_at_the_target_itself_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    target = tmp_path / "manifest.json"
    target.symlink_to(victim)
    safe_io.write_file(target, b"new\n")
    assert victim.read_text() == "mine\n"
    assert not target.is_symlink() and target.read_bytes() == b"new\n"


def test_a_failed_or_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "data.npz"
    target.write_bytes(b"old")
    for error in (RuntimeError("a bug"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with safe_io.replacing(target) as f:
                f.write(b"half of the new")
                raise error
        assert target.read_bytes() == b"old"
        assert [p.name for p in tmp_path.iterdir()] == ["data.npz"], "no temporary file left"


@pytest.mark.parametrize("where", ["write", "fsync", "create"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch, where, code):
    target = tmp_path / "heads-0123456789abcdef.safetensors"
    full = OSError(code, os.strerror(code))

    def fail(*args, **kwargs):
        raise full

    if where == "fsync":
        monkeypatch.setattr(os, "fsync", fail)
    if where == "create":
        monkeypatch.setattr(safe_io.write, "_create_temporary", fail)
    with pytest.raises(DiskFull) as caught:
        with safe_io.replacing(target) as f:
            if where == "write":
                fail()
            f.write(b"x")
    monkeypatch.undo()
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"no space left on device writing {target}"), line
    assert isinstance(caught.value, OSError) and caught.value.filename == str(target)
    assert list(tmp_path.iterdir()) == [], "nothing half-written, no temporary file"


@needs_links
def test_a_link_swapped_in_for_the_temporary_file_before_the_rename_is_not_left_as_the_file(tmp_path, monkeypatch):
    """In a folder others may write, the temporary file can be swapped for a link in the instant before the
    rename: the link that lands under the name is removed (never what it points to) and the write fails."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    folder = tmp_path / "shared"
    folder.mkdir()
    real_replace = os.replace

    def swapped_then_replace(src, dst):
        os.unlink(src)
        os.symlink(victim, src)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", swapped_then_replace)
    with pytest.raises(OSError, match="swapped"):
        safe_io.write_file(folder / "plan.json", b"{}")
    monkeypatch.undo()
    assert victim.read_text() == "mine\n" and list(folder.iterdir()) == []


def test_the_mode_is_the_one_asked_for_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        safe_io.write_file(tmp_path / "shard-00000.npz", b"x", mode=0o644)
        safe_io.write_file(tmp_path / "checkpoint.json", b"x", mode=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shard-00000.npz").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "checkpoint.json").stat().st_mode) == 0o600


# ---------------------------------------------------------------------------
# The reader.
# ---------------------------------------------------------------------------


SPECIAL = {
    "a FIFO with no writer": lambda p: os.mkfifo(p),
    "a link to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "a link to /dev/urandom": lambda p: p.symlink_to("/dev/urandom"),
    "a link to /proc/self/pagemap": lambda p: p.symlink_to("/proc/self/pagemap"),
    "a folder": lambda p: p.mkdir(),
}


@needs_links
@pytest.mark.parametrize("what", sorted(SPECIAL))
@pytest.mark.parametrize("read", ["read_json", "read_bytes", "sha256_of_file"])
def test_a_special_file_is_refused_at_once_never_read(tmp_path, what, read):
    path = tmp_path / "heads.json"
    SPECIAL[what](path)
    if not os.path.exists(path) and "pagemap" in what:
        pytest.skip("no /proc/self/pagemap here")
    call = {
        "read_json": lambda: safe_io.read_json(path),
        "read_bytes": lambda: safe_io.read_bytes(path, 1 << 20),
        "sha256_of_file": lambda: safe_io.sha256_of_file(path),
    }[read]
    with pytest.raises(Refused) as caught:
        within(5, call)
    assert "\n" not in str(caught.value)
    assert ("not a regular file" in str(caught.value)) == ("pagemap" not in what), str(caught.value)


@needs_links
def test_a_link_is_refused_where_links_are_not_followed(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "plan.json"
    link.symlink_to(real)
    assert safe_io.read_json(link) == {}
    with pytest.raises(Refused, match="symbolic link"):
        safe_io.read_json(link, follow_links=False)


def test_the_size_bound_the_depth_and_the_type(tmp_path):
    path = tmp_path / "made.json"
    path.write_text(json.dumps({"x": "y" * 100}))
    with pytest.raises(Refused, match="more than the 50"):
        safe_io.read_json(path, max_bytes=50)
    for text, why in [
        ("[" * 100_000 + "]" * 100_000, "deeper"),
        ('{"a": [1, 2', "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got a JSON list"),
        ('"x"', "got a JSON string"),
    ]:
        path.write_text(text)
        with pytest.raises(Refused, match=why):
            safe_io.read_json(path)
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(Refused, match="not valid JSON"):
        safe_io.read_json(path)
    with pytest.raises(FileNotFoundError):
        safe_io.read_json(tmp_path / "missing.json")


def test_what_was_written_is_hashed_whole_before_it_gets_its_name(tmp_path):
    """sha256_of on the temporary file being written counts every byte, buffered ones included."""
    import hashlib

    data = b"x" * 100_003 + b"a tail"
    with safe_io.replacing(tmp_path / "shard-00000.npz") as f:
        f.write(data[:100_003])
        f.write(data[100_003:])  # still in the file object's buffer
        assert safe_io.sha256_of(f) == hashlib.sha256(data).hexdigest()
        f.write(b"more")
    assert (tmp_path / "shard-00000.npz").read_bytes() == data + b"more"


def test_json_nested_deeper_than_specdec_writes_is_refused_however_deep(tmp_path):
    """100,000 levels (Python's parser gives up: RecursionError) and 500 levels (it parses them; whatever then
    compares or walks the value would not) are refused alike; 32 levels, the bound, are read."""
    path = tmp_path / "manifest.json"
    for depth in (100_000, 500, 33):
        path.write_text("[" * depth + "]" * depth)
        with pytest.raises(Refused, match="nests deeper than 32 levels"):
            safe_io.read_json(path, expect=list)
    path.write_text('{"a": ' * 31 + "[]" + "}" * 31)
    assert isinstance(safe_io.read_json(path), dict)
