"""The transposed weights kept beside a checkpoint (specdec/checkpoints/layout.py): used when they
match the checkpoint, never when it has changed, and never in the way of a load."""

import os

import numpy as np
import pytest
from conftest import hub_tensors, tiny_model, write_checkpoint

from specdec.checkpoints import layout as layoutcache
from specdec.checkpoints.load import LINEARS, block_linear, load_folder
from specdec.checkpoints.safetensors import CheckpointError, read_metadata, write_safetensors

TOKENS = np.array([5, 70, 200, 3, 9])


@pytest.fixture(autouse=True)
def every_size(monkeypatch):
    """Tiny checkpoints count as large enough, and the switch is on."""
    monkeypatch.setattr(layoutcache, "MIN_BYTES", 0)
    monkeypatch.delenv("SPECDEC_NO_LAYOUT_CACHE", raising=False)


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
    import specdec.checkpoints.load as checkpoint

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
        write_safetensors(path, {f"h.{i}.{n}.weight": block_linear(b, n).w_t
                                 for i, b in enumerate(model.weights.blocks) for n in LINEARS},
                          metadata=stamp)  # fmt: skip
    else:  # the right stamp, but each weight in the checkpoint's layout, not transposed
        stamp = layoutcache.stamp(folder / "model.safetensors")
        write_safetensors(path, {name: t for name, t in hub_tensors(model).items() if name.endswith(
            tuple(f"{n}.weight" for n in LINEARS))}, metadata=stamp)  # fmt: skip
    reloaded = load_folder(folder)
    assert not kept(reloaded)
    np.testing.assert_array_equal(reloaded(TOKENS), model(TOKENS))
    assert kept(load_folder(folder)), "the damaged file was replaced by a good one"


def test_no_file_where_it_cannot_be_written_and_no_partial_left(tmp_path, monkeypatch):
    model = tiny_model(seed=1)
    folder = write_checkpoint(tmp_path / "m", model)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layoutcache, "write_safetensors", disk_full)
    np.testing.assert_array_equal(load_folder(folder)(TOKENS), model(TOKENS))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]

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
