"""GGUF files (specdec/checkpoints/gguf_file.py, gguf.py) written here: every supported type dequantizes to what
was quantized, and hostile or truncated files are one CheckpointError naming the file (and the tensor)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from specdec.checkpoints.gguf import load_gguf
from specdec.checkpoints.gguf_file import GGUFFile
from specdec.checkpoints.safetensors import CheckpointError
from specdec.model.llama import LlamaHParams, random_llama

TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "BF16": 30}


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


class F64(float):
    """A metadata value written as a float64 (type 12), where any double fits: inf and NaN too."""


def value(v) -> bytes:
    if isinstance(v, F64):
        return struct.pack("<Id", 12, v)
    if isinstance(v, str):
        return struct.pack("<I", 8) + s(v)
    if isinstance(v, float):
        return struct.pack("<If", 6, v)
    if isinstance(v, list):  # arrays of strings or of int32
        if v and isinstance(v[0], str):
            return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(s(x) for x in v)
        return struct.pack("<IIQ", 9, 5, len(v)) + struct.pack(f"<{len(v)}i", *v)
    return struct.pack("<II", 4, v)


def quantize(w: np.ndarray, kind: str) -> bytes:
    """The reference quantizers, written from ggml's block layouts (low nibbles = first 16 weights)."""
    flat = w.astype(np.float32).reshape(-1)
    if kind == "F32":
        return flat.tobytes()
    if kind == "F16":
        return flat.astype("<f2").tobytes()
    if kind == "BF16":
        return (flat.view(np.uint32) >> 16).astype("<u2").tobytes()
    out = b""
    for block in flat.reshape(-1, 32):
        if kind == "Q8_0":
            d = np.float16(np.abs(block).max() / 127)
            q = np.round(block / np.float32(d)).astype(np.int8) if d else np.zeros(32, np.int8)
            out += d.tobytes() + q.tobytes()
            continue
        if kind == "Q4_0":
            d = np.float16(np.abs(block).max() / 7)
            q = np.clip(np.round(block / np.float32(d)) + 8, 0, 15).astype(np.uint8)
            out += d.tobytes() + (q[:16] | (q[16:] << 4)).tobytes()
        else:  # Q4_1
            lo, hi = block.min(), block.max()
            d, m = np.float16((hi - lo) / 15), np.float16(lo)
            q = np.clip(np.round((block - np.float32(m)) / np.float32(d)), 0, 15).astype(np.uint8)
            out += d.tobytes() + m.tobytes() + (q[:16] | (q[16:] << 4)).tobytes()
    return out


def dequantized_reference(w: np.ndarray, kind: str) -> np.ndarray:
    """What the quantized bytes mean, computed from the same rounding as quantize()."""
    flat = w.astype(np.float32).reshape(-1, 32) if kind.startswith("Q") else w.astype(np.float32)
    if kind == "F32":
        return flat
    if kind == "F16":
        return flat.astype(np.float16).astype(np.float32)
    if kind == "BF16":
        return ((flat.view(np.uint32) >> 16) << 16).view(np.float32)
    rows = []
    for block in flat:
        if kind == "Q8_0":
            d = np.float32(np.float16(np.abs(block).max() / 127))
            rows.append(np.round(block / d) * d)
        elif kind == "Q4_0":
            d = np.float32(np.float16(np.abs(block).max() / 7))
            rows.append((np.clip(np.round(block / d) + 8, 0, 15) - 8) * d)
        else:
            d, m = (np.float32(np.float16(x)) for x in ((block.max() - block.min()) / 15, block.min()))
            rows.append(np.clip(np.round((block - m) / d), 0, 15) * d + m)
    return np.array(rows, np.float32).reshape(w.shape)


def write_gguf(path, tensors: dict, metadata: dict | None = None, align: int = 32, version: int = 3) -> None:
    """tensors: name -> (array in NumPy shape, type name)."""
    meta = metadata or {}
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta))
    head += b"".join(s(k) + value(v) for k, v in meta.items())
    blobs, offset, table = [], 0, b""
    for name, (w, kind) in tensors.items():
        data = quantize(w, kind)
        dims = list(reversed(w.shape))
        table += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        table += struct.pack("<IQ", TYPE_IDS[kind], offset)
        pad = -len(data) % align
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    body = head + table
    path.write_bytes(body + b"\0" * (-len(body) % align) + b"".join(blobs))


@pytest.mark.parametrize("kind", list(TYPE_IDS))
def test_every_type_dequantizes_to_what_was_written(tmp_path, kind):
    w = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    write_gguf(tmp_path / "m.gguf", {"w": (w, kind)})
    got = GGUFFile(tmp_path / "m.gguf").tensor("w")
    assert got.dtype == np.float32 and got.shape == (3, 64)
    np.testing.assert_array_equal(got, dequantized_reference(w, kind))
    if kind.startswith("Q4"):  # the nibble order matters: interleaving the halves gives other weights
        swapped = dequantized_reference(w.reshape(-1, 2, 16).swapaxes(1, 2).reshape(3, 64), kind)
        assert not np.array_equal(got, swapped)


def tiny_llama_gguf(path, model, **changes) -> None:
    """A whole tiny Llama as a GGUF (F32), with llama.cpp's Q/K row order, and a toy byte-level vocabulary."""
    h = model.hparams
    meta = {
        "general.architecture": "llama",
        "llama.context_length": h.n_ctx,
        "llama.embedding_length": h.n_embd,
        "llama.block_count": h.n_layer,
        "llama.feed_forward_length": h.n_ff,
        "llama.attention.head_count": h.n_head,
        "llama.attention.head_count_kv": h.n_kv_head,
        "llama.rope.freq_base": float(h.rope_theta),
        "llama.attention.layer_norm_rms_epsilon": float(h.rms_eps),
        "llama.vocab_size": h.n_vocab,
    }
    meta.update(changes.pop("meta", {}))

    def permute(w, n):  # what llama.cpp's converter does to W_q and W_k
        return w.reshape(n, 2, w.shape[0] // n // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)

    t = {"token_embd.weight": model.weights.wte, "output_norm.weight": model.weights.norm_f}
    for i, b in enumerate(model.weights.blocks):
        p = f"blk.{i}."
        t.update(
            {
                p + "attn_norm.weight": b.attn_norm,
                p + "attn_q.weight": permute(b.attn_q.w_t, h.n_head),
                p + "attn_k.weight": permute(b.attn_k.w_t, h.n_kv_head),
                p + "attn_v.weight": b.attn_v.w_t,
                p + "attn_output.weight": b.attn_output.w_t,
                p + "ffn_norm.weight": b.ffn_norm,
                p + "ffn_gate.weight": b.ffn_gate.w_t,
                p + "ffn_up.weight": b.ffn_up.w_t,
                p + "ffn_down.weight": b.ffn_down.w_t,
            }
        )
    t.update(changes.pop("tensors", {}))
    write_gguf(path, {k: (v, "F32") for k, v in t.items() if v is not None}, meta)


def test_a_llama_written_as_gguf_loads_with_the_same_logits(tmp_path):
    model = random_llama(
        LlamaHParams(n_vocab=64, n_ctx=32, n_embd=64, n_head=4, n_kv_head=2, n_layer=2, n_ff=64), seed=5, scale=0.3
    )
    tiny_llama_gguf(tmp_path / "m.gguf", model)
    loaded = load_gguf(tmp_path / "m.gguf")
    tokens = [3, 1, 4, 1, 5, 9]
    np.testing.assert_allclose(loaded(tokens), model(tokens), atol=1e-5)
    tiny_llama_gguf(tmp_path / "bad.gguf", model, meta={"llama.attention.head_count_kv": 4})  # K rows mis-sized
    with pytest.raises(CheckpointError, match="attn_k.weight.*expected"):
        load_gguf(tmp_path / "bad.gguf")
    tiny_llama_gguf(tmp_path / "gpt.gguf", model, meta={"general.architecture": "gpt2"})
    with pytest.raises(CheckpointError, match="architecture 'gpt2'"):
        load_gguf(tmp_path / "gpt.gguf")
    nan = model.weights.blocks[0].ffn_up.w_t.copy()
    nan[0, 0] = np.nan
    tiny_llama_gguf(tmp_path / "nan.gguf", model, tensors={"blk.0.ffn_up.weight": nan})
    with pytest.raises(CheckpointError, match="'blk.0.ffn_up.weight': holds NaN"):
        load_gguf(tmp_path / "nan.gguf")


def test_a_qwen2_file_is_read_under_its_own_keys_and_needs_its_biases(tmp_path):
    """The fixture Qwen2 rewritten: without a bias it is refused by name; labelled llama, the biases are extra."""
    f = GGUFFile(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-qwen2.gguf")
    meta = {k: v for k, v in f.metadata.items() if k.startswith(("general.architecture", "qwen2."))}
    meta["qwen2.vocab_size"] = f.tensors["token_embd.weight"].shape[0]  # no tokenizer written here
    tensors = {name: (f.tensor(name), "F32") for name in f.tensors}
    write_gguf(tmp_path / "q.gguf", {k: v for k, v in tensors.items() if k != "blk.1.attn_v.bias"}, meta)
    with pytest.raises(CheckpointError, match="no tensor 'blk.1.attn_v.bias'; a qwen2 GGUF with 2 blocks needs it"):
        load_gguf(tmp_path / "q.gguf")
    as_llama = {k.replace("qwen2.", "llama."): v for k, v in meta.items()} | {"general.architecture": "llama"}
    write_gguf(tmp_path / "l.gguf", tensors, as_llama)
    with pytest.raises(CheckpointError, match="unexpected tensors blk.0.attn_k.bias.*not a plain llama model"):
        load_gguf(tmp_path / "l.gguf")


HOSTILE = {
    "empty": lambda good: b"",
    "not gguf": lambda good: b"GGML" + good[4:],
    "version 9": lambda good: good[:4] + struct.pack("<I", 9) + good[8:],
    "truncated header": lambda good: good[:30],
    "truncated data": lambda good: good[:-40],  # past the 28 bytes of padding, into the blocks
    "a billion tensors": lambda good: good[:8] + struct.pack("<Q", 10**9) + good[16:],
    "huge string": lambda good: good[:24] + struct.pack("<Q", 1 << 40) + good[32:],
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_one_checkpoint_error_naming_the_file(tmp_path, case):
    write_gguf(tmp_path / "good.gguf", {"w": (np.ones((2, 32), np.float32), "Q8_0")}, {"general.name": "x"})
    path = tmp_path / "bad.gguf"
    path.write_bytes(HOSTILE[case](path.with_name("good.gguf").read_bytes()))
    with pytest.raises(CheckpointError) as e:
        GGUFFile(path).tensor("w")
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_unsupported_quantizations_are_refused_by_name(tmp_path):
    write_gguf(tmp_path / "m.gguf", {"w": (np.ones((2, 32), np.float32), "F32")})
    data = bytearray((tmp_path / "m.gguf").read_bytes())
    at = data.index(b"w") + 1 + 4 + 16  # after the name: n_dims u32, two u64 dims, then the type
    data[at : at + 4] = struct.pack("<I", 12)  # Q4_K
    (tmp_path / "k.gguf").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="tensor 'w': Q4_K quantization is not supported"):
        GGUFFile(tmp_path / "k.gguf")


def tensor_entry(name: str, dims: list[int], offset: int, kind: int = 0) -> bytes:
    return (
        s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset)
    )


def raw_gguf(entries: list[bytes], meta: bytes = b"", n_meta: int = 0, data: int = 512, version: int = 3) -> bytes:
    body = b"GGUF" + struct.pack("<IQQ", version, len(entries), n_meta) + meta + b"".join(entries)
    return body + b"\0" * (-len(body) % 32) + b"\0" * data


MORE_HOSTILE = {
    "big-endian": (raw_gguf([], version=3 << 24), "big-endian"),
    "a key twice": (raw_gguf([], s("k") + value(1) + s("k") + value(2), n_meta=2), "metadata 'k' twice"),
    "overlapping tensors": (raw_gguf([tensor_entry("a", [64], 0), tensor_entry("b", [64], 128)]), "'b': overlaps"),
    "misaligned offset": (raw_gguf([tensor_entry("a", [4], 4)]), "'a': starts at offset 4, not a multiple"),
}


@pytest.mark.parametrize("case", list(MORE_HOSTILE))
def test_more_hostile_tables_are_refused_by_what_is_wrong(tmp_path, case):
    data, message = MORE_HOSTILE[case]
    (tmp_path / "bad.gguf").write_bytes(data)
    with pytest.raises(CheckpointError, match=message) as e:
        GGUFFile(tmp_path / "bad.gguf")
    assert str(tmp_path / "bad.gguf") in str(e.value)


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(tensors={"rope_freqs.weight": np.ones(8, np.float32)}), "rope_freqs.weight"),
        (dict(meta={"llama.rope.scaling.type": "linear"}), "scaling.type is 'linear'"),
        (dict(meta={"llama.rope.dimension_count": 8}), "partial rotary"),
        (dict(tensors={"blk.0.attn_q_norm.weight": np.ones(16, np.float32)}), "unexpected tensors blk.0.attn_q_norm"),
    ],
)
def test_llama_variants_it_does_not_implement_are_refused(tmp_path, changes, message):
    model = random_llama(LlamaHParams(n_vocab=64, n_ctx=32, n_embd=64, n_head=4, n_kv_head=2, n_layer=1, n_ff=64))
    tiny_llama_gguf(tmp_path / "v.gguf", model, **changes)
    with pytest.raises(CheckpointError, match=message):
        load_gguf(tmp_path / "v.gguf")


# ---------------------------------------------------------------------------
# Limits: every size the metadata gives is checked against the file before anything is built from it.
# ---------------------------------------------------------------------------


def small_llama():
    return random_llama(LlamaHParams(n_vocab=64, n_ctx=32, n_embd=64, n_head=4, n_kv_head=2, n_layer=1, n_ff=64))


@pytest.mark.parametrize("block_count", [10**7, 2**32 - 1])
def test_a_huge_block_count_is_refused_at_once(tmp_path, block_count):
    """A layer count the tensor table cannot hold is refused before a name is built for each layer."""
    import time

    tiny_llama_gguf(tmp_path / "m.gguf", small_llama(), meta={"llama.block_count": block_count})
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"llama.block_count is {block_count}") as e:
        load_gguf(tmp_path / "m.gguf")
    assert time.perf_counter() - start < 1.0 and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "key,bad",
    [
        ("llama.context_length", float("inf")),
        ("llama.context_length", float("nan")),
        ("llama.context_length", 1.5),
        ("llama.embedding_length", -64.0),
        ("llama.rope.freq_base", float("inf")),
        ("llama.rope.freq_base", float("nan")),
        ("llama.rope.freq_base", 0.0),
        ("llama.attention.layer_norm_rms_epsilon", float("nan")),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5),
        ("llama.attention.layer_norm_rms_epsilon", 0.0),
    ],
)
def test_sizes_and_constants_that_are_not_finite_or_in_range_are_refused_at_load(tmp_path, key, bad):
    """Refused at load as one line naming the GGUF key (not config.json): never a traceback, never a model
    that runs with positions ignored or fails only while decoding."""
    path = tmp_path / "m.gguf"
    tiny_llama_gguf(path, small_llama(), meta={key: F64(bad)})
    with pytest.raises(CheckpointError) as e:
        load_gguf(path)
    message = str(e.value)
    assert key in message and "config.json" not in message and "\n" not in message and str(path) in message


def test_a_fifo_named_gguf_is_refused_without_blocking(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    code = "import sys; from specdec.checkpoints.gguf_file import GGUFFile\nGGUFFile(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert proc.returncode != 0 and "not a regular file" in proc.stderr.splitlines()[-1]


def test_counts_the_file_cannot_hold_are_refused_before_reading_items(tmp_path):
    """An array or table that claims more items than the bytes left could hold is refused by its count."""
    meta = s("k") + struct.pack("<IIQ", 9, 8, 1 << 23)  # an array of 8M strings in a file of a few hundred bytes
    (tmp_path / "a.gguf").write_bytes(raw_gguf([], meta, n_meta=1))
    with pytest.raises(CheckpointError, match="claims 8388608 array items"):
        GGUFFile(tmp_path / "a.gguf")
    (tmp_path / "t.gguf").write_bytes(raw_gguf([])[:8] + struct.pack("<QQ", 1 << 20, 0) + b"\0" * 64)
    with pytest.raises(CheckpointError, match="claims 1048576 tensors"):
        GGUFFile(tmp_path / "t.gguf")


def test_the_command_line_says_cleanly_that_a_gguf_has_no_tokenizer(tmp_path, capsys):
    from specdec.cli import main

    tiny_llama_gguf(tmp_path / "m.gguf", small_llama())  # llama.vocab_size, no tokenizer.ggml.* keys
    code = main.main(["--target_model_size", str(tmp_path / "m.gguf"), "--draft", "ngram", "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "no tokenizer" in err and str(tmp_path / "m.gguf") in err


@pytest.mark.parametrize("arch", [["llama"], 7, "absent"])
def test_an_architecture_that_is_not_a_string_is_one_line(tmp_path, capsys, arch):
    from specdec import __main__ as main

    path = tmp_path / "m.gguf"
    tiny_llama_gguf(path, small_llama(), meta={"general.architecture": arch})
    if arch == "absent":  # the key renamed: no general.architecture at all
        path.write_bytes(path.read_bytes().replace(s("general.architecture"), s("general.architectur_")))
    with pytest.raises(CheckpointError, match="architecture") as e:
        load_gguf(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    code = main.main(["--target_model_size", str(path), "--draft", "ngram", "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("scale", [b"\x00\x7c", b"\x00\xfe"])  # float16 inf, NaN
def test_a_damaged_scale_is_one_error_with_no_numpy_warning_before_it(tmp_path, scale):
    """A Q8_0 block whose scale is inf or NaN dequantizes to NaN (inf * 0): the tensor is refused by name,
    and NumPy's 'invalid value' warning from the arithmetic is not printed ahead of that line."""
    import warnings

    w = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w": (w, "Q8_0")})
    data = bytearray(path.read_bytes())
    blocks = len(quantize(w, "Q8_0"))
    first = len(data) - blocks - (-blocks % 32)  # the data section: the one tensor's blocks, padded
    data[first : first + 2] = scale
    path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError, match="tensor 'w': holds NaN or infinite values"):
            GGUFFile(path).tensor("w")
    assert [str(c.message) for c in caught] == []
