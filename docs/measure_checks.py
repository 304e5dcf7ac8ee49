"""What the checks on specdec's own files cost (docs/checkpoints.md): loads with and without the kept
layout, the layout's check alone, a first load, the model fingerprint, a whole load_heads.

    python -m specdec.bench --write-checkpoints files-bench --sizes 124M,355M
    python docs/measure_checks.py load files-bench/124M files-bench/355M
    python docs/measure_checks.py scan|first|fingerprint|heads FOLDER...

Run it with PYTHONPATH set to the checkout being measured. Every number is a median of
--repeats runs with the page cache warm (one untimed run first).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from specdec.checkpoints import layout
from specdec.checkpoints.load import load_folder
from specdec.checkpoints.safetensors import read_safetensors
from specdec.drafters import eagle_grad
from specdec.drafters.heads import DraftVocab, load_heads, model_fingerprint, save_heads
from specdec.model.fast import kernels


def median(f, repeats: int, before=lambda: None) -> str:
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return f"median {statistics.median(times):.3f} s (min {min(times):.3f}, {repeats} runs)"


def load(folder: Path, repeats: int) -> None:
    """load_folder through the kept layout (written by an untimed first load), and copying."""
    load_folder(folder)
    print(f"{folder}: kept layout {median(lambda: load_folder(folder), repeats)}")
    print(
        f"{folder}: copying ({'keep_layout=False'}) {median(lambda: load_folder(folder, keep_layout=False), repeats)}"
    )


def first(folder: Path, repeats: int) -> None:
    """A first load: copy, then write (and, with the checks, checksum and read back) the kept layout."""
    remove = lambda: (folder / layout.FILE_NAME).unlink(missing_ok=True)  # noqa: E731
    print(f"{folder}: first load {median(lambda: load_folder(folder), repeats, before=remove)}")


def scan(folder: Path, repeats: int) -> None:
    """The load-time check alone (CRC-32 and NaN scan of every kept tensor), and its parts on one thread."""
    load_folder(folder)
    tensors = read_safetensors(folder / layout.FILE_NAME)
    layout.scan(tensors)  # map every page first
    gb = sum(a.nbytes for a in tensors.values()) / 1e9
    print(
        f"{folder}: layout.scan of {gb:.2f} GB on {kernels.SPLIT_PARTS} workers "
        f"{median(lambda: layout.scan(tensors), repeats)}"
    )
    flats = [np.asarray(a).reshape(-1) for a in tensors.values()]
    chunk = 1 << 18
    parts = {
        "crc32": lambda: [zlib.crc32(f[s : s + chunk]) for f in flats for s in range(0, f.size, chunk)],
        "isfinite": lambda: [np.isfinite(f[s : s + chunk]).all() for f in flats for s in range(0, f.size, chunk)],
        "sha256": lambda: [hashlib.sha256(f).digest() for f in flats],
    }
    for name, f in parts.items():
        print(f"{folder}:   {name} alone, one thread, {median(f, repeats)}")


def fingerprint(folder: Path, repeats: int) -> None:
    """model_fingerprint (samples of every tensor) against hashing every byte of the model."""
    model = load_folder(folder)
    w = model.weights
    arrays = [w.wte, w.wpe, w.ln_f_weight, w.ln_f_bias]
    for block in w.blocks:
        for value in vars(block).values():
            arrays += [value.w_t, value.b] if hasattr(value, "w_t") else [value]
    arrays = [np.ascontiguousarray(a) for a in arrays]
    gb = sum(a.nbytes for a in arrays) / 1e9

    def every_byte(h):
        return lambda: [h.update(a) for a in arrays]

    for name, f in (
        ("model_fingerprint", lambda: model_fingerprint(model)),
        ("sha256 of every byte", lambda: every_byte(hashlib.sha256())()),
        ("crc32 of every byte", lambda: [zlib.crc32(a) for a in arrays]),
    ):
        f()
        print(f"{folder} ({gb:.2f} GB): {name} {median(f, repeats)}")


def heads(folder: Path, repeats: int) -> None:
    """A whole load_heads (fingerprint, sha256 of the weights file, every check) for 4 Medusa heads and EAGLE."""
    target = load_folder(folder)
    rng, e = np.random.default_rng(0), target.n_embd
    medusa = {"w": rng.standard_normal((4, e, e), np.float32) * 0.01, "b": np.zeros((4, e), np.float32)}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, params, n in (("medusa", medusa, 4), ("eagle", eagle_grad.init_params(e, rng), 1)):
            path = save_heads(Path(tmp) / kind, kind, target, params, {"n_heads": n}, DraftVocab.of(target))
            f = lambda d=Path(tmp) / kind, k=kind: load_heads(d, k, target)  # noqa: E731
            f()
            print(f"{folder} {kind} ({path.stat().st_size / 1e6:.0f} MB of heads): load_heads {median(f, repeats)}")


if __name__ == "__main__":
    sections = {"load": load, "first": first, "scan": scan, "fingerprint": fingerprint, "heads": heads}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("section", choices=sections)
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    for folder in args.folders:
        sections[args.section](folder, args.repeats)
