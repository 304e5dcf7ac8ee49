"""The transposed weights kept beside a checkpoint (specdec/checkpoints/layout.py): used when they
match the checkpoint, never when it has changed, and never in the way of a load."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, hub_tensors, tiny_model, write_checkpoint

from specdec.checkpoints import layout as layoutcache
from specdec.checkpoints.gpt2_folder import LINEARS, block_linear
from specdec.checkpoints.load import load_folder
from specdec.checkpoints.safetensors import CheckpointError, read_metadata, write_safetensors

TOKENS = np.array([5, 70, 200, 3, 9])


@pytest.fixture(autouse=True)
def every_size(monkeypatch, tmp_path):
    """Tiny checkpoints count as large enough, and the switch is on; the record of each kept file
    (layout.record_of) goes to a home of the test's own."""
    monkeypatch.setattr(layoutcache, "MIN_BYTES", 0)
    monkeypatch.delenv("SPECDEC_NO_LAYOUT_CACHE", raising=False)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))


def linears(model):
    return [block_linear(b, name) for b in model.weights.blocks for name in LINEARS]


def kept(model) -> bool:
    """Whether the model's linear weights are the kept file's (read-only memory maps), not fresh copies."""
    flags = {lin.w_t.flags.writeable for lin in linears(model)}
    assert len(flags) == 1, "all linear weights must come from one place"
    return not flags.pop()


def touch_later(path, seconds=10):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


def test_the_second_load_maps_the_kept_weights_and_computes_the_same_logits(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    first = load_folder(folder)
    assert not kept(first) and (folder / layoutcache.FILE_NAME).is_file()
    second = load_folder(folder)
    assert kept(second)
    assert np.array_equal(second(TOKENS), first(TOKENS))
    for a, b in zip(linears(first), linears(second)):
        assert a.w_t.shape == b.w_t.shape and np.array_equal(a.w_t, b.w_t)
    size = (folder / "model.safetensors").stat().st_size
    assert read_metadata(folder / layoutcache.FILE_NAME)["source_size"] == str(size)


def test_a_changed_checkpoint_is_never_served_stale(tmp_path):
    """Same names, shapes and file size (so the same header); only the values and the mtime differ."""
    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    load_folder(folder)
    new = tiny_model(seed=2)
    write_checkpoint(folder, new)
    touch_later(folder / "model.safetensors")  # in case the filesystem's clock is coarse
    reloaded = load_folder(folder)
    assert not kept(reloaded), "a stale file must not be used"
    np.testing.assert_array_equal(reloaded(TOKENS), new(TOKENS))
    assert kept(load_folder(folder)), "the file is written again for the new checkpoint"
    np.testing.assert_array_equal(load_folder(folder)(TOKENS), new(TOKENS))


def test_a_changed_checkpoint_with_its_old_modification_time_is_not_served_stale(tmp_path):
    """What `cp -p`, `rsync -a` or `tar -x` do: new contents (same size and header), old mtime."""
    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    load_folder(folder)
    old = (folder / "model.safetensors").stat()
    new = tiny_model(seed=2)
    write_checkpoint(folder, new)
    os.utime(folder / "model.safetensors", ns=(old.st_atime_ns, old.st_mtime_ns))
    assert (folder / "model.safetensors").stat().st_mtime_ns == old.st_mtime_ns
    np.testing.assert_array_equal(load_folder(folder)(TOKENS), new(TOKENS))


def test_a_checkpoint_replaced_while_it_is_read_is_copied_not_mixed(tmp_path, monkeypatch):
    """The stamp is taken again after reading: a checkpoint swapped in meanwhile (as a re-download's
    rename does) gets neither the old kept weights nor a file filed under the wrong stamp."""
    import specdec.checkpoints.gpt2_folder as checkpoint

    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    load_folder(folder)
    new = tiny_model(seed=2)
    write_checkpoint(tmp_path / "new", new)
    read = checkpoint.read_safetensors

    def swap_then_read(path):
        os.replace(tmp_path / "new" / "model.safetensors", folder / "model.safetensors")
        monkeypatch.setattr(checkpoint, "read_safetensors", read)
        return read(path)

    monkeypatch.setattr(checkpoint, "read_safetensors", swap_then_read)
    model = load_folder(folder)
    assert not kept(model)
    np.testing.assert_array_equal(model(TOKENS), new(TOKENS))
    np.testing.assert_array_equal(load_folder(folder)(TOKENS), new(TOKENS))


def test_writing_says_so_and_the_file_is_as_readable_as_the_checkpoint(tmp_path, capsys):
    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    (folder / "model.safetensors").chmod(0o600)
    load_folder(folder)
    assert "keeping the transposed weights" in capsys.readouterr().err
    assert (folder / layoutcache.FILE_NAME).stat().st_mode & 0o777 == 0o600
    load_folder(folder)
    assert capsys.readouterr().err == "", "said once, when written"


def test_a_checkpoint_damaged_after_the_file_was_written_is_still_refused(tmp_path):
    """The NaN scan is skipped only for weights the kept file vouches for: a checkpoint changed since
    (here a NaN written into a linear weight) is scanned again."""
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    load_folder(folder)
    tensors = hub_tensors(model)
    tensors["h.1.mlp.c_fc.weight"] = tensors["h.1.mlp.c_fc.weight"].copy()
    tensors["h.1.mlp.c_fc.weight"][3, 7] = np.nan
    write_safetensors(folder / "model.safetensors", tensors)
    touch_later(folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="'h.1.mlp.c_fc.weight' holds NaN"):
        load_folder(folder)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong stamp", "wrong shapes"])
def test_a_damaged_or_foreign_file_is_ignored_and_replaced(tmp_path, damage):
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    load_folder(folder)
    path = folder / layoutcache.FILE_NAME
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "garbage":
        path.write_bytes(b"\xff" * 1000)
    elif damage == "wrong stamp":  # a file for another checkpoint
        stamp = layoutcache.stamp(folder / "model.safetensors") | {"source_mtime_ns": "1"}
        write_safetensors(
            path,
            {f"h.{i}.{n}.weight": block_linear(b, n).w_t for i, b in enumerate(model.weights.blocks) for n in LINEARS},
            metadata=stamp,
        )
    else:  # the right stamp, but each weight in the checkpoint's layout, not transposed
        stamp = layoutcache.stamp(folder / "model.safetensors")
        write_safetensors(
            path,
            {name: t for name, t in hub_tensors(model).items() if name.endswith(tuple(f"{n}.weight" for n in LINEARS))},
            metadata=stamp,
        )
    reloaded = load_folder(folder)
    assert not kept(reloaded)
    np.testing.assert_array_equal(reloaded(TOKENS), model(TOKENS))
    assert kept(load_folder(folder)), "the damaged file was replaced by a good one"


def test_no_file_where_it_cannot_be_written_and_no_partial_left(tmp_path, monkeypatch):
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layoutcache, "write_safetensors_to", disk_full)
    np.testing.assert_array_equal(load_folder(folder)(TOKENS), model(TOKENS))
    assert sorted(p.name for p in folder.iterdir()) == [
        layoutcache.LOCK_NAME,
        "config.json",
        "merges.txt",
        "model.safetensors",
        "vocab.json",
    ]

    monkeypatch.undo()
    monkeypatch.setattr(layoutcache, "MIN_BYTES", 0)
    monkeypatch.delenv("SPECDEC_NO_LAYOUT_CACHE", raising=False)
    monkeypatch.setattr(layoutcache.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 100})())
    load_folder(folder)
    assert not (folder / layoutcache.FILE_NAME).exists(), "too little free space: nothing written"


def test_switched_off_by_the_environment_and_for_small_checkpoints(tmp_path, monkeypatch):
    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    load_folder(folder)  # writes the file
    monkeypatch.setenv("SPECDEC_NO_LAYOUT_CACHE", "1")
    assert not kept(load_folder(folder)), "switched off: the file is not used"
    monkeypatch.delenv("SPECDEC_NO_LAYOUT_CACHE")
    assert not kept(load_folder(folder, keep_layout=False)), "switched off by the argument"
    assert kept(load_folder(folder))
    monkeypatch.setattr(layoutcache, "MIN_BYTES", 1 << 40)
    other = write_checkpoint(tmp_path / "small", tiny_model(seed=2))
    load_folder(other)
    assert not (other / layoutcache.FILE_NAME).exists()


def test_float16_checkpoints_keep_a_float32_layout(tmp_path):
    model = tiny_model(seed=3)
    folder = write_checkpoint(tmp_path / "m", model, dtype="F16")
    first = load_folder(folder)
    second = load_folder(folder)
    assert kept(second) and second.weights.blocks[0].mlp_c_fc.w_t.dtype == np.float32
    np.testing.assert_array_equal(second(TOKENS), first(TOKENS))


# --- What the kept file must prove before it is used (issue 22) --------------------------------------------


def data_start(path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def layout_entry(path, name):
    """(start, end) in the file of one kept tensor's bytes."""
    from specdec.checkpoints.safetensors import index_safetensors

    entries, start, _ = index_safetensors(path)
    begin, end = next((b, e) for n, _, _, b, e in entries if n == name)
    return start + begin, start + end


def overwrite(path, offset, data: bytes):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("damage", ["finite values overwritten", "a NaN planted", "two tensors' bytes swapped"])
def test_damage_inside_the_kept_data_is_caught_and_the_checkpoint_served(tmp_path, capsys, damage):
    """The header (and so the stamp) intact: only the data changed. The kept file's checksum and the NaN
    scan catch it; the load copies from the checkpoint (right logits), says so once, and writes it again."""
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    load_folder(folder)
    path = folder / layoutcache.FILE_NAME
    begin, end = layout_entry(path, "h.1.mlp.c_fc.weight")
    if damage == "finite values overwritten":
        overwrite(path, begin + 64, np.full(256, 0.5, np.float32).tobytes())
    elif damage == "a NaN planted":
        overwrite(path, begin + 64, np.float32(np.nan).tobytes())
    else:  # same shape, so the header cannot tell; each tensor's own checksum can
        a, b = layout_entry(path, "h.0.attn.c_proj.weight"), layout_entry(path, "h.1.attn.c_proj.weight")
        raw = path.read_bytes()
        overwrite(path, a[0], raw[b[0] : b[1]])
        overwrite(path, b[0], raw[a[0] : a[1]])
    capsys.readouterr()
    reloaded = load_folder(folder)
    assert not kept(reloaded)
    np.testing.assert_array_equal(reloaded(TOKENS), model(TOKENS))
    line = one_line(capsys.readouterr().err)
    assert str(path) in line and ("checksum" in line or "NaN" in line) and "damaged" in line
    again = load_folder(folder)
    assert kept(again), "written again, whole"
    np.testing.assert_array_equal(again(TOKENS), model(TOKENS))
    assert capsys.readouterr().err == ""


def stat_result(uid=1000, mode=0o100644):
    return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    "kept_uid,kept_mode,checkpoint_uid,me,trusted",
    [
        (1000, 0o100644, 1000, 1000, True),  # all mine
        (1000, 0o100600, 0, 1000, True),  # mine, beside root's checkpoint (root may have made the folder mine)
        (0, 0o100644, 0, 1000, True),  # the checkpoint owner's, loaded by me
        (1001, 0o100644, 0, 0, False),  # planted by another user beside root's checkpoint: root must not use it
        (1001, 0o100644, 1000, 1000, False),
        (1000, 0o100664, 1000, 1000, False),  # group-writable
        (1000, 0o100646, 1000, 1000, False),  # world-writable
        (1000, 0o040755, 1000, 1000, False),  # a directory
    ],
)
def test_the_rule_for_trusting_a_kept_file(kept_uid, kept_mode, checkpoint_uid, me, trusted):
    why = layoutcache.untrusted(stat_result(kept_uid, kept_mode), stat_result(checkpoint_uid), me)
    assert (why is None) == trusted, why


def test_a_kept_file_others_can_write_is_ignored_and_replaced(tmp_path, capsys):
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    (folder / "model.safetensors").chmod(0o664)  # a group-writable checkpoint: the kept file still is not
    load_folder(folder)
    path = folder / layoutcache.FILE_NAME
    assert path.stat().st_mode & 0o777 == 0o644
    path.chmod(0o666)
    capsys.readouterr()
    reloaded = load_folder(folder)
    assert not kept(reloaded)
    np.testing.assert_array_equal(reloaded(TOKENS), model(TOKENS))
    line = one_line(capsys.readouterr().err)
    assert str(path) in line and "other" in line and "can write" in line
    assert path.stat().st_mode & 0o777 == 0o644, "replaced by a file of our own"
    assert kept(load_folder(folder))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to give a file away")
def test_a_kept_file_planted_by_another_user_is_not_used(tmp_path, capsys):
    """The issue's attack: another user writes a well-formed kept file (right stamp, right checksums) with
    altered weights beside a checkpoint it cannot change. The owner check refuses it."""
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    path = folder / layoutcache.FILE_NAME
    other = tiny_model(seed=5)  # the attacker's weights, under the real checkpoint's stamp
    tensors = {f"h.{i}.{n}.weight": block_linear(b, n).w_t for i, b in enumerate(other.weights.blocks) for n in LINEARS}
    stamp = layoutcache.stamp(folder / "model.safetensors")
    crcs, _ = layoutcache.scan(tensors)
    write_safetensors(path, tensors, metadata={**stamp, "content_crc32": json.dumps(crcs)})
    path.chmod(0o644)
    os.chown(path, 4321, 4321)
    assert (
        layoutcache.read(folder / "model.safetensors", stamp, {n: t.shape[::-1] for n, t in tensors.items()})[0] is None
    )
    capsys.readouterr()
    reloaded = load_folder(folder)
    np.testing.assert_array_equal(reloaded(TOKENS), model(TOKENS))
    line = one_line(capsys.readouterr().err)
    assert "owned by user id 4321" in line
    assert path.stat().st_uid == 0 and kept(load_folder(folder))


def test_a_symbolic_link_under_the_kept_name_is_not_followed(tmp_path):
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    load_folder(folder)
    path = folder / layoutcache.FILE_NAME
    os.replace(path, tmp_path / "elsewhere.safetensors")
    path.symlink_to(tmp_path / "elsewhere.safetensors")
    reloaded = load_folder(folder)
    assert not kept(reloaded)
    np.testing.assert_array_equal(reloaded(TOKENS), model(TOKENS))
    assert path.is_file() and not path.is_symlink() and kept(load_folder(folder))


def test_a_stale_temporary_file_is_removed_by_the_next_load(tmp_path):
    """kill -9 while writing leaves .specdec-transposed.safetensors.XXXX: the next load removes it once
    it is older than a few minutes (a younger one may be another process's, still being written)."""
    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    load_folder(folder)
    old, young = folder / f".{layoutcache.FILE_NAME}.dead1", folder / f".{layoutcache.FILE_NAME}.live2"
    for p in (old, young):
        p.write_bytes(b"\0" * 1000)
    past = time.time() - layoutcache.STALE_SECONDS - 60
    os.utime(old, (past, past))
    assert kept(load_folder(folder)), "removed even when the kept file is fine (nothing is written)"
    assert not old.exists() and young.exists()


def test_checked_on_write_a_file_that_does_not_read_back_never_gets_its_name(tmp_path, monkeypatch):
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    real = layoutcache.write_safetensors_to

    def write_then_damage(f, tensors, dtype, metadata):
        size = real(f, tensors, dtype, metadata=metadata)
        f.flush()
        os.pwrite(f.fileno(), b"\x7f" * 8, size - 8)  # as a bad disk or a bug in the writer would
        return size

    monkeypatch.setattr(layoutcache, "write_safetensors_to", write_then_damage)
    np.testing.assert_array_equal(load_folder(folder)(TOKENS), model(TOKENS))
    assert sorted(p.name for p in folder.iterdir()) == [
        layoutcache.LOCK_NAME,
        "config.json",
        "merges.txt",
        "model.safetensors",
        "vocab.json",
    ]


def test_a_directory_under_the_kept_name_writes_nothing_and_says_nothing(tmp_path, capsys, monkeypatch):
    """Checked before anything is written or said: no 170 MB written to be thrown away, no line per load."""
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    (folder / layoutcache.FILE_NAME).mkdir()
    monkeypatch.setattr(layoutcache, "write_safetensors_to", lambda *a, **k: pytest.fail("nothing may be written"))
    for _ in range(2):
        np.testing.assert_array_equal(load_folder(folder)(TOKENS), model(TOKENS))
    assert capsys.readouterr().err == ""
    assert not list(folder.glob(f".{layoutcache.FILE_NAME}.*"))


def test_a_folder_that_cannot_be_written_writes_nothing_and_says_nothing(tmp_path, capsys, monkeypatch):
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    monkeypatch.setattr(layoutcache, "write_safetensors_to", lambda *a, **k: pytest.fail("nothing may be written"))
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        folder.chmod(0o555)  # a real read-only folder (root would still be allowed to write it)
    else:
        real_access = os.access
        monkeypatch.setattr(layoutcache.os, "access", lambda p, mode: False if p == folder else real_access(p, mode))
    try:
        for _ in range(2):
            np.testing.assert_array_equal(load_folder(folder)(TOKENS), model(TOKENS))
    finally:
        folder.chmod(0o755)
    assert capsys.readouterr().err == ""


def test_a_load_while_another_process_writes_the_file_writes_no_second_copy(tmp_path, capsys):
    """The lock is taken by another process: this load copies for itself and writes nothing."""
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder / layoutcache.LOCK_NAME)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        np.testing.assert_array_equal(load_folder(folder)(TOKENS), model(TOKENS))
        assert not (folder / layoutcache.FILE_NAME).exists() and capsys.readouterr().err == ""
    finally:
        holder.kill()
        holder.wait()
    assert not kept(load_folder(folder)) and kept(load_folder(folder)), "the lock is free again: kept as usual"


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""

FIRST_LOAD = """
import sys, time
from specdec.checkpoints import layout
from specdec.checkpoints.load import load_folder
layout.MIN_BYTES = 0
real = layout.write_safetensors_to
def slow(*args, **kwargs):  # every process is between its check and its write at once
    time.sleep(1.5)
    return real(*args, **kwargs)
layout.write_safetensors_to = slow
print("ready", flush=True)
sys.stdin.readline()
load_folder(sys.argv[1])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks")
def test_three_simultaneous_first_loads_write_one_copy(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model(seed=1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SPECDEC_NO_LAYOUT_CACHE", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_LOAD, str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    for p in procs:
        assert p.stdout.readline() == "ready\n"
    for p in procs:  # go, all at once
        p.stdin.write("\n")
        p.stdin.flush()
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    assert sum(e.count("keeping the transposed weights") for e in errs) == 1, errs
    assert not list(folder.glob(f".{layoutcache.FILE_NAME}.*"))
