"""Which threads multiply a model's weight matrices, chosen by timing both on this machine (kernels.linear).

kernels.linear can run a product on specdec's own worker threads (each core
multiplies its part of W's rows: "workers", the default rules of
kernels.default_path) or on OpenBLAS's threads ("blas": one product; "gemvs":
one matrix-vector product per token, W read from RAM for the first token and
from cache for the rest). Which is faster depends on the machine: on an idle
2-vCPU VM, handing half a matrix to a Python worker thread and back costs about
120 us (a sleeping thread has to be woken), as long as streaming a whole 576 x 576
matrix, while OpenBLAS's threads spin between products and hand off for almost
nothing; on a busy machine a spinning thread may wait for a core instead, and
for a few tokens OpenBLAS's matrix-matrix product first repacks W
(docs/performance.md).

The two kinds of thread do not mix well: OpenBLAS's threads keep spinning for a
while after each product, on the core a worker thread needs. So a plan is chosen
per number of new tokens (kernels.M_BUCKETS), and for each bucket it is wholly
one or the other:
  1. `measure`: within OpenBLAS's family, for 2..MAX_GEMVS tokens, time "blas"
     against "gemvs" on the model's own matrices, shape by shape (each matrix
     streams from RAM, as in a pass), and keep the faster per shape;
  2. `confirm`: time runs of whole passes over m new tokens with that family
     and with the workers, interleaved, and keep the faster for that bucket.

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
import re
import time
from pathlib import Path

import numpy as np

from ..linear import Linear
from ... import safe_io
from . import kernels, threads
from .kernels import M_BUCKETS, PATHS
from .spin import OPENBLAS_SPIN

FORMAT = "specdec-kernel-plan"
MAX_FILE_BYTES = 1 << 20  # a plan file is a few kB; a larger one is not read
MAX_PLANS = 256  # shapes in one file: a model has a handful, every model specdec knows a few dozen
KEY = re.compile(r"[1-9][0-9]{0,6}x[1-9][0-9]{0,6}/float(32|64)/[1-9][0-9]{0,2}")  # kernels.shape_key's form
_FOLDER_OWNER = "the models folder's owner"
VERSION = 3  # 3: OpenBLAS's threads must win by CONFIRM_MARGIN (plans of version 2 are measured again)
REPEATS = 3  # interleaved timings per (bucket, path); the median decides
PER_SHAPE = 4  # matrices of each shape timed (of SmolLM2's 30 per shape, GPT-2 124M's 12)
GIVE_UP = 3.0  # a sweep this many times slower than the fastest stops early
CONFIRM_REPEATS = 3  # runs of whole passes per side when OpenBLAS's plan is checked against the rules (`confirm`)
# How much faster OpenBLAS's threads must be than specdec's workers for a bucket to take them. NOTE: a plan is
# timed once, and the machine is not always as idle as then: when other processes hold the cores, a product on
# OpenBLAS's threads waits a scheduler slice for each sleeping thread, and a pass can cost 10-30 times its idle
# time (SmolLM2's passes of 9+ tokens measured r(9) = 28.6 at load 3-4 under such a plan, 2.15 on the workers;
# a batch of 16 rows slowed from 67 to 1-3 tokens/s), while the workers slow in proportion to the load. So
# OpenBLAS's threads take a bucket only when they win clearly, and the rules keep it otherwise.
CONFIRM_MARGIN = 1.25
RUN = 2  # passes per run
CONTEXT = 32  # cached tokens before those passes
ENV = "SPECDEC_KERNELS"  # one of MODES (fast/__init__.py says what each does); unset: "plan"
MODES = ("plan", "measure", "rules", "plain")
MODE: str | None = None  # a mode set from Python (fast.set_kernels), which outranks ENV; None: follow ENV


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


def candidates(m: int) -> tuple[str, ...]:
    """OpenBLAS's ways to multiply m tokens: one product, or for a few tokens also one per token."""
    return ("blas", "gemvs") if 1 < m <= kernels.MAX_GEMVS else ("blas",)


def sample(linears: list[Linear], per_shape: int = PER_SHAPE) -> list[Linear]:
    """At most `per_shape` matrices of each shape, spread over the model, in the model's order: still far more
    bytes than the CPU's caches hold (so each product streams its matrix), in a fraction of a pass's time."""
    by_shape: dict[str, list[Linear]] = {}
    for lin in linears:
        by_shape.setdefault(kernels.shape_key(lin), []).append(lin)
    keep = {
        id(group[round(i * (len(group) - 1) / max(1, per_shape - 1))])
        for group in by_shape.values()
        for i in range(min(per_shape, len(group)))
    }
    return [lin for lin in linears if id(lin) in keep]


def measure(linears: list[Linear], repeats: int = REPEATS, clock=time.perf_counter) -> dict[str, list[str]]:
    """{shape key: OpenBLAS's faster way for each of M_BUCKETS}, timed on these matrices (the module docstring).

    For each bucket m with a choice, each repeat sweeps both ways in turn over
    the matrices; a way's time for a shape is the sum over that shape's matrices
    within one sweep, and the median over repeats decides. A sweep running past
    GIVE_UP times the fastest whole sweep so far stops there and counts as
    infinitely slow. Inputs are random: a product's time does not depend on them.
    """
    rng = np.random.default_rng(0)
    keys = [kernels.shape_key(lin) for lin in linears]
    plan: dict[str, list[str]] = {key: [] for key in keys}
    for m in M_BUCKETS:
        ways = candidates(m)
        if len(ways) == 1:
            for rows in plan.values():
                rows.append(ways[0])
            continue
        inputs = {lin.w_t.shape[1]: rng.standard_normal((m, lin.w_t.shape[1])).astype(lin.w_t.dtype) for lin in linears}
        times = {(key, way): [] for key in plan for way in ways}
        fastest = np.inf  # the fastest complete sweep at this m
        with kernels.pass_threads(m):  # as inside a forward pass over m tokens
            for repeat in range(repeats):
                for way in ways[repeat % len(ways) :] + ways[: repeat % len(ways)]:
                    sweep = dict.fromkeys(plan, 0.0)
                    started = clock()
                    for key, lin in zip(keys, linears):
                        start = clock()
                        kernels.linear(inputs[lin.w_t.shape[1]], lin, way)
                        sweep[key] += clock() - start
                        if clock() - started > GIVE_UP * fastest:
                            sweep = dict.fromkeys(plan, np.inf)
                            break
                    fastest = min(fastest, clock() - started)
                    for key in plan:
                        times[key, way].append(sweep[key])
        for key, rows in plan.items():
            rows.append(min(ways, key=lambda way: float(np.median(times[key, way]))))
    return plan


def rules(lin: Linear) -> list[str]:
    """The default rules' path for each of M_BUCKETS (kernels.default_path), as a plan."""
    return [kernels.default_path(m, len(kernels.split(lin).parts)) for m in M_BUCKETS]


def confirm(
    model, linears: list[Linear], plan: dict[str, list[str]], repeats: int = CONFIRM_REPEATS, clock=time.perf_counter
) -> dict[str, list[str]]:
    """Bucket by bucket, OpenBLAS's plan where whole passes run faster with it than with the rules, else the rules.

    For each bucket m, runs of RUN passes over m new tokens after `context` cached
    ones (as decoding makes them: one pass after another of the same size) with
    either plan in kernels.PLANS, interleaved; the faster median run wins the
    bucket. PLANS is as it was afterwards, even when a pass fails.
    """
    default = {kernels.shape_key(lin): rules(lin) for lin in linears}
    kept = {key: list(rows) for key, rows in default.items()}
    context = min(CONTEXT, model.n_ctx // 2)
    if context < 1:
        return kept  # no room for a pass after a context: the rules
    sides = {
        "openblas": {key: tuple(plan[key]) for key in default},
        "workers": {key: tuple(default[key]) for key in default},
    }
    before = dict(kernels.PLANS)
    try:
        cache = model.new_cache()
        model.forward(np.arange(1, context + 1) % model.n_vocab, cache)
        for i, m in enumerate(M_BUCKETS):
            if context + m > model.n_ctx or all(plan[key][i] == default[key][i] for key in default):
                continue  # no room in a toy's context, or nothing to decide
            times: dict[str, list[float]] = {side: [] for side in sides}
            for repeat in range(repeats):
                for side in list(sides) if repeat % 2 == 0 else list(sides)[::-1]:
                    kernels.PLANS.update(sides[side])
                    times[side].append(time_run(model, cache, context, m, 1 + repeat % 7, clock))
            if np.median(times["openblas"]) * CONFIRM_MARGIN < np.median(times["workers"]):
                for key in default:
                    kept[key][i] = plan[key][i]
    finally:
        kernels.PLANS.clear()
        kernels.PLANS.update(before)
    return kept


def time_run(model, cache, context: int, m: int, token: int, clock) -> float:
    """Seconds for RUN passes over m new tokens after `context` cached ones, after one untimed pass (so the
    threads are as decoding finds them); the cache is rolled back after each."""
    model.forward(np.full(m, token), cache)
    cache.rollback(context)
    start = clock()
    for _ in range(RUN):
        model.forward(np.full(m, token), cache)
        cache.rollback(context)
    return clock() - start


def machine() -> dict:
    """What a plan depends on besides the shapes: the CPU, the cores specdec uses, NumPy, OpenBLAS and how
    long its idle threads spin (OPENBLAS_SPIN: a product's time after a product of the other kind of
    thread depends on it)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    blas = threads.BLAS
    return {
        "cpu": cpu,
        "cpus": threads.usable_cpus(),
        "split_parts": kernels.SPLIT_PARTS,
        "blas_threads": threads.BLAS_THREADS,
        "numpy": np.__version__,
        "openblas": None if blas is None else f"{blas.name} {blas.core}",
        "openblas_spin": OPENBLAS_SPIN,
    }


def plan_file(folder: str | os.PathLike) -> Path:
    """This machine's plan file in `folder`: named by a hash of `machine()`, so another machine never reads it."""
    digest = hashlib.sha256(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / f"kernel-plan-{digest}.json"


def read_plan(path: Path) -> dict[str, list[str]]:
    """The plans in a plan file, or {} where it is missing or fails any check (it is then measured again).

    NOTE: the models folder may be shared, even world-writable, so the file is held to the rule
    the kept layouts follow (safe_io.untrusted: owned by the user loading or the folder's owner,
    writable by its owner only; a link is not followed, a FIFO not waited on), and to the form
    write_plan writes: at most MAX_PLANS shapes, each key a shape_key, each plan one of PATHS per
    bucket. A planted plan could otherwise make every load slow, or put escape sequences in a key.
    """
    try:
        with safe_io.open_regular(path, MAX_FILE_BYTES, follow_links=False) as f:
            if safe_io.untrusted(os.fstat(f.fileno()), path.parent.stat(), safe_io.user_id(), _FOLDER_OWNER):
                return {}
            data = safe_io.parse_json(safe_io.read_all(f, MAX_FILE_BYTES))
    except (OSError, ValueError):  # missing, unreadable, a link or a FIFO, too large, not JSON, nested too deep
        return {}
    ok = (
        data.get("format") == FORMAT
        and data.get("version") == VERSION
        and data.get("machine") == machine()
        and data.get("buckets") == list(M_BUCKETS)
        and isinstance(data.get("plans"), dict)
        and len(data["plans"]) <= MAX_PLANS
    )
    if not ok:
        return {}
    plans = data["plans"]
    valid = all(
        isinstance(key, str)
        and KEY.fullmatch(key)
        and isinstance(plan, list)
        and len(plan) == len(M_BUCKETS)
        and all(p in PATHS for p in plan)
        for key, plan in plans.items()
    )
    return plans if valid else {}


def write_plan(path: Path, plans: dict[str, list[str]]) -> None:
    """Write the plan file whole or not at all (safe_io.write_json: a new temporary file, never through a link
    planted in the folder, renamed over it), readable by all, writable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "version": VERSION, "machine": machine(), "buckets": list(M_BUCKETS), "plans": plans}
    safe_io.write_json(path, data, mode=0o644)


def check_mode(mode) -> str:
    """A mode as given (SPECDEC_KERNELS, or set_kernels), checked: one of MODES ("" is "plan")."""
    mode = mode or "plan"
    if mode not in MODES:
        raise ValueError(f"{ENV} must be one of {', '.join(MODES)} (or unset: 'plan'); not {mode!r:.40}")
    return mode


def kernels_mode() -> str:
    """The mode in force: set from Python (MODE), else SPECDEC_KERNELS, else "plan"."""
    return MODE or check_mode(os.environ.get(ENV, ""))


def tune(model, folder: str | os.PathLike | None, say=None) -> dict[str, list[str]]:
    """Give the shapes of the model's split matrices their plans (kernels.PLANS, which every matrix of those
    shapes follows, a draft head's included): from this machine's plan file in `folder` where it has them, else
    measured now (10-20 seconds for a 135M model on 2 cores) and added to the file.

    Matrices too small to split keep the default rules (their products are too
    short to time, and fit in cache). folder None: measure, keep nothing on disk.
    say: called with one line before a measurement (load_model prints it where it
    shows download progress). Returns the plans used, by shape key.
    """
    mode = kernels_mode()
    if mode in ("rules", "plain") or threads.BLAS is None or threads.BLAS_THREADS == 1:
        return {}  # (with OpenBLAS on one thread, specdec's workers are the only way to use both cores)
    linears = [lin for lin in linears_of(model.weights) if len(kernels.split(lin).parts) > 1]
    if not linears:
        return {}
    path = None if folder is None else plan_file(folder)
    known = {} if path is None else read_plan(path)  # other models' shapes stay in the file
    if mode == "measure" or any(kernels.shape_key(lin) not in known for lin in linears):
        if say is not None:
            where = "" if path is None else f"; kept in {path}"
            say(
                f"{getattr(model, 'name', 'model')}: timing this machine's matrix products (once: 10-20 s for a 135M model on 2 cores, longer for larger ones{where})"
            )
        fresh = confirm(model, linears, measure(sample(linears)))
        # Shapes already planned keep their plan (unless measuring again): a model loaded later must not
        # change the threads of one loaded before it.
        known = {**known, **fresh} if mode == "measure" else {**fresh, **known}
        if path is not None:
            try:
                write_plan(path, known)
            except OSError as e:  # a read-only models folder: the plan holds for this process only
                if say is not None:
                    say(f"could not keep the timings in {path} ({e.strerror or e}): the next run times them again")
    for lin in linears:
        kernels.PLANS[kernels.shape_key(lin)] = tuple(
            known[kernels.shape_key(lin)]
        )  # for these matrices and any other of their shapes
    return known
