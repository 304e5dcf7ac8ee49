"""Checkpoint files on the clock (the io section), and random-weight checkpoints for an offline run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ... import safe_io
from ...checkpoints.gpt2_folder import save_folder
from ...checkpoints.load import load_folder
from ...checkpoints.safetensors import read_safetensors
from ...model.gpt2 import GPT2, random_weights
from ...speculative import speculative_sample
from .common import ALL_SIZES, TOKEN, Bench, stats_ms, table

# ---------------------------------------------------------------------------
# io: checkpoint files, load time, peak memory.
# ---------------------------------------------------------------------------


def write_random_checkpoints(root: Path, sizes: list[str], tokenizer_dir: Path, seed: int) -> None:
    """GPT-2-shaped checkpoints with random weights and the real tokenizer, for an
    offline end-to-end run of main.py (its text is noise; its timings are real)."""
    for name in ("vocab.json", "merges.txt"):
        if not (tokenizer_dir / name).is_file():
            raise SystemExit(
                f"{tokenizer_dir / name} not found: pass --tokenizer DIR holding GPT-2's vocab.json and merges.txt"
            )
    for i, size in enumerate(sizes):
        folder = root / size
        n_bytes = save_folder(GPT2(ALL_SIZES[size], random_weights(ALL_SIZES[size], seed=seed + i), name=size), folder)
        for name in ("vocab.json", "merges.txt"):
            safe_io.write_file(folder / name, safe_io.read_bytes(tokenizer_dir / name, 64 << 20))
        print(f"wrote {folder}: {n_bytes / 1e6:.0f} MB of random {size}-shaped weights + the GPT-2 tokenizer")


def proc_status_kb(field_name: str) -> int | None:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in kB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_child(draft_dir: str, target_dir: str, n_tokens: int) -> None:
    """In a fresh process: load two checkpoints, generate speculatively, print memory as JSON."""
    baseline = proc_status_kb("VmRSS")  # the interpreter and NumPy
    draft = load_folder(draft_dir, with_tokenizer=False)
    target = load_folder(target_dir, with_tokenizer=False)
    after_load = proc_status_kb("VmRSS")
    out = speculative_sample(target, draft, [TOKEN, 11, 290], n_tokens, K=4, temperature=1.0, seed=0)
    print(
        json.dumps(
            {
                "baseline_kb": baseline,
                "after_load_kb": after_load,
                "peak_kb": proc_status_kb("VmHWM"),
                "tokens": len(out.tokens),
            }
        )
    )


def section_io(bench: Bench) -> None:
    draft_size, target_size = bench.args.sizes[0], bench.args.sizes[-1]
    tmp = Path(tempfile.mkdtemp(prefix="specdec-bench-"))
    try:
        files = {size: save_folder(bench.model(size), tmp / size) for size in dict.fromkeys([draft_size, target_size])}
        path = tmp / target_size / "model.safetensors"

        start = time.perf_counter()
        load_folder(tmp / target_size, with_tokenizer=False)  # copies, and keeps the layout (checkpoints/layout.py)
        first_load = time.perf_counter() - start
        load_copying = lambda: load_folder(tmp / target_size, with_tokenizer=False, keep_layout=False)  # noqa: E731
        times = bench.time(
            {
                "open": lambda: read_safetensors(path),
                "load": load_copying,
                "load_kept": lambda: load_folder(tmp / target_size, with_tokenizer=False),
            },
            max(3, bench.args.nocache_repeats),
        )
        load_folder(tmp / draft_size, with_tokenizer=False)  # so the child loads both through their kept layouts
        cmd = [
            sys.executable,
            "-m",
            "specdec.bench",
            "--rss-child",
            str(tmp / draft_size),
            str(tmp / target_size),
            "--rss-tokens",
            str(bench.args.rss_tokens),
        ]
        child = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if child.returncode:
            raise RuntimeError(f"the peak-RSS child process failed:\n{child.stderr}")
        mem = json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    file_sum = sum(files.values())
    peak = mem["peak_kb"] * 1024
    res = {
        "draft": draft_size,
        "target": target_size,
        "file_bytes": files,
        "file_bytes_sum": file_sum,
        "open_ms": stats_ms(times["open"]),
        "load_folder_ms": stats_ms(times["load"]),
        "load_folder_kept_ms": stats_ms(times["load_kept"]),
        "first_load_ms": first_load * 1e3,
        "memory": mem,
        "peak_over_files": peak / file_sum,
    }
    bench.results["io"] = res
    table(
        bench.out,
        f"io: {target_size}-shaped safetensors (F32, warm page cache), and the peak RSS of a process "
        f"loading {draft_size} + {target_size} and generating {bench.args.rss_tokens} tokens speculatively",
        "open = header + np.memmap; copying = that + checks + transposed copies; first = copying + writing the "
        "kept layout; kept = loading with it; peak = VmHWM of a child process loading both through their "
        "kept layouts",
        [
            "file MB",
            "open ms",
            "copying ms",
            "first ms",
            "kept ms",
            "files MB",
            "baseline MB",
            "after load MB",
            "peak MB",
            "peak/files",
        ],
        [
            [
                files[target_size] / 1e6,
                res["open_ms"]["median_ms"],
                res["load_folder_ms"]["median_ms"],
                first_load * 1e3,
                res["load_folder_kept_ms"]["median_ms"],
                file_sum / 1e6,
                mem["baseline_kb"] / 1e3,
                mem["after_load_kb"] / 1e3,
                peak / 1e6,
                res["peak_over_files"],
            ]
        ],
    )
