"""Each weight matrix's product path, chosen by timing the paths on this machine (kernels.linear's plan).

kernels.linear can multiply a few tokens by a weight matrix three ways
(kernels.PATHS): split over specdec's worker threads, on OpenBLAS's own threads,
or on one thread. No single rule picks the fastest for every matrix: on an idle
2-vCPU VM, handing half a matrix to a worker and back costs about 120 us, as long
as streaming a whole 576 x 576 matrix, while OpenBLAS's threads, which spin
between products, hand off for almost nothing; on a busy machine the spinning
thread may wait for a core instead (docs/performance.md). So the paths are timed
where they will run: `tune` multiplies a few tokens by every matrix of the model
in the model's order (so each matrix comes from RAM, as in a pass), by each path,
interleaved and repeated, for each number of tokens in kernels.M_BUCKETS, and
gives every matrix the fastest path per bucket, chosen per shape.

The plan is kept in a small JSON file per machine (`plan_file`), read back only
after it is checked, so a machine measures once and every later run multiplies
the same way (the same rounding, so a seeded run repeats exactly). Delete the file,
or set SPECDEC_KERNELS=measure, to measure again (after a hardware or NumPy change
the key differs and it measures by itself); SPECDEC_KERNELS=rules skips it all and
keeps the default rules (kernels.default_path).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from . import kernels, threads
from .kernels import M_BUCKETS, PATHS, Linear

FORMAT = "specdec-kernel-plan"
VERSION = 1
REPEATS = 3  # interleaved timings per (bucket, path); the median decides
PER_SHAPE = 4  # matrices of each shape timed (of SmolLM2's 30 per shape, GPT-2 124M's 12)
GIVE_UP = 3.0  # a sweep this many times slower than the fastest stops early
ENV = "SPECDEC_KERNELS"  # "rules": no plan; "measure": measure again and rewrite the file; unset: use the file


def linears_of(weights) -> list[Linear]:
    """Every Linear in a model's weights, in the order a pass multiplies by them (dataclass field order)."""
    found: dict[int, Linear] = {}

    def walk(value) -> None:
        if isinstance(value, Linear):
            found.setdefault(id(value), value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                walk(getattr(value, field.name))

    walk(weights)
    return list(found.values())


def shape_key(lin: Linear) -> str:
    """'960x576/float32/2': rows x columns of W.T, dtype, parts. Matrices with one key share a plan."""
    n_out, n_in = lin.w_t.shape
    return f"{n_out}x{n_in}/{lin.w_t.dtype}/{len(lin.parts)}"


def candidates(lin: Linear) -> tuple[str, ...]:
    """The paths worth timing for a matrix: the split only where it is split, OpenBLAS's threads only where
    there are several."""
    return tuple(p for p in PATHS if (p != "workers" or len(lin.parts) > 1) and (p != "blas" or threads.BLAS_THREADS > 1))


def sample(linears: list[Linear], per_shape: int = PER_SHAPE) -> list[Linear]:
    """At most `per_shape` matrices of each shape, spread over the model, in the model's order: still far more
    bytes than the CPU's caches hold (so each product streams its matrix), in a fraction of a pass's time."""
    by_shape: dict[str, list[Linear]] = {}
    for lin in linears:
        by_shape.setdefault(shape_key(lin), []).append(lin)
    keep = {id(group[round(i * (len(group) - 1) / max(1, per_shape - 1))])
            for group in by_shape.values() for i in range(min(per_shape, len(group)))}  # fmt: skip
    return [lin for lin in linears if id(lin) in keep]


def measure(linears: list[Linear], repeats: int = REPEATS, clock=time.perf_counter) -> dict[str, list[str]]:
    """{shape key: the fastest path for each of M_BUCKETS}, timed on these matrices (see the module docstring).

    For each bucket m, each repeat sweeps every candidate path in a rotated order;
    a path's time for a shape is the sum over that shape's matrices within one
    sweep, and the median over repeats decides. A sweep running past GIVE_UP times
    the fastest whole sweep so far stops there and counts as infinitely slow (on a
    busy machine, OpenBLAS's threads can take 100x longer than the other paths).
    Inputs are random: a product's time does not depend on the values.
    """
    rng = np.random.default_rng(0)
    keys = [shape_key(lin) for lin in linears]
    paths = {key: candidates(lin) for key, lin in zip(keys, linears)}
    union = [p for p in PATHS if any(p in ps for ps in paths.values())]
    plan: dict[str, list[str]] = {key: [] for key in paths}
    for m in M_BUCKETS:
        inputs = {lin.w_t.shape[1]: rng.standard_normal((m, lin.w_t.shape[1])).astype(lin.w_t.dtype) for lin in linears}
        times = {(key, p): [] for key in paths for p in paths[key]}
        fastest = np.inf  # the fastest complete sweep at this m
        with kernels.pass_threads(m):  # as inside a forward pass over m tokens
            for repeat in range(repeats):
                for path in union[repeat % len(union) :] + union[: repeat % len(union)]:
                    sweep = dict.fromkeys(paths, 0.0)
                    started = clock()
                    for key, lin in zip(keys, linears):
                        if path in paths[key]:
                            start = clock()
                            kernels.linear(inputs[lin.w_t.shape[1]], lin, path)
                            sweep[key] += clock() - start
                        if clock() - started > GIVE_UP * fastest:
                            sweep = dict.fromkeys(paths, np.inf)
                            break
                    fastest = min(fastest, clock() - started)
                    for key in paths:
                        if path in paths[key]:
                            times[key, path].append(sweep[key])
        for key in paths:
            plan[key].append(min(paths[key], key=lambda p: float(np.median(times[key, p]))))
    return plan


def machine() -> dict:
    """What a plan depends on besides the shapes: the CPU, the cores specdec uses, NumPy, OpenBLAS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    blas = threads.BLAS
    return {"cpu": cpu, "cpus": threads.usable_cpus(), "split_parts": kernels.SPLIT_PARTS,
            "blas_threads": threads.BLAS_THREADS, "numpy": np.__version__,
            "openblas": None if blas is None else f"{blas.name} {blas.core}"}  # fmt: skip


def plan_file(folder: str | os.PathLike) -> Path:
    """This machine's plan file in `folder`: named by a hash of `machine()`, so another machine never reads it."""
    digest = hashlib.sha256(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / f"kernel-plan-{digest}.json"


def read_plan(path: Path) -> dict[str, list[str]]:
    """The plans in a plan file, or {} where it is missing or fails any check (it is then measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = (isinstance(data, dict) and data.get("format") == FORMAT and data.get("version") == VERSION
          and data.get("machine") == machine() and data.get("buckets") == list(M_BUCKETS)
          and isinstance(data.get("plans"), dict))  # fmt: skip
    if not ok:
        return {}
    plans = data["plans"]
    valid = all(isinstance(key, str) and isinstance(plan, list) and len(plan) == len(M_BUCKETS)
                and all(p in PATHS for p in plan) for key, plan in plans.items())  # fmt: skip
    return plans if valid else {}


def write_plan(path: Path, plans: dict[str, list[str]]) -> None:
    """Write the plan file whole or not at all (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "version": VERSION, "machine": machine(), "buckets": list(M_BUCKETS), "plans": plans}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def tune(model, folder: str | os.PathLike | None, say=None) -> dict[str, list[str]]:
    """Give each of the model's split matrices its plan: from this machine's plan file in `folder` where it
    has their shapes, else measured now (a second or two for a 135M model) and added to the file.

    Matrices too small to split keep the default rules (their products are too
    short to time, and fit in cache). folder None: measure, keep nothing on disk.
    say: called with one line before a measurement (load_model prints it where it
    shows download progress). Returns the plans used, by shape key.
    """
    mode = os.environ.get(ENV, "")
    if mode not in ("", "rules", "measure"):
        raise ValueError(f"{ENV} must be 'rules' (no measured plan) or 'measure' (measure again), or unset; not {mode!r}")
    if mode == "rules" or threads.BLAS is None:
        return {}
    linears = [lin for lin in linears_of(model.weights) if len(lin.parts) > 1]
    if not linears:
        return {}
    path = None if folder is None else plan_file(folder)
    known = {} if path is None or mode == "measure" else read_plan(path)
    if any(shape_key(lin) not in known for lin in linears):
        if say is not None:
            where = "" if path is None else f"; kept in {path}"
            say(f"{getattr(model, 'name', 'model')}: timing this machine's matrix products (once, a few seconds{where})")
        known = {**known, **measure(sample(linears))}
        if path is not None:
            try:
                write_plan(path, known)
            except OSError:  # a read-only cache folder: the plan still holds for this process
                pass
    for lin in linears:
        lin.plan = tuple(known[shape_key(lin)])
    return known
