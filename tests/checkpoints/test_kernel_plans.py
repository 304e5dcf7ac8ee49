"""The kernel plan file in a models folder others may write (model/tuning.py): written through no planted
link, and trusted only when it is this user's (or the folder owner's), no one else's to write, and of the form
specdec writes."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from specdec import safe_io
from specdec.checkpoints.load import load_model
from specdec.model.fast import kernels, threads, tuning
from specdec.model.fast.kernels import M_BUCKETS

needs_blas = pytest.mark.skipif(
    threads.BLAS is None or threads.BLAS_THREADS == 1, reason="NumPy's OpenBLAS on one thread: nothing is tuned"
)
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to give a file away")


@pytest.fixture(autouse=True)
def split_and_fake_timing(monkeypatch):
    """Every matrix of a tiny model split (so it has a plan), the timing replaced by a fixed answer, and no
    plan leaking between tests (kernels.PLANS is process-wide). measured: one entry per measurement."""
    monkeypatch.setattr(kernels, "PLANS", {})
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    monkeypatch.setattr(kernels, "SPLIT_PARTS", 2)
    monkeypatch.delenv(tuning.ENV, raising=False)
    measured = []

    def fake_measure(linears, repeats=None, clock=None):
        measured.append(len(linears))
        return {kernels.shape_key(lin): ["blas"] * len(M_BUCKETS) for lin in linears}

    monkeypatch.setattr(tuning, "measure", fake_measure)
    monkeypatch.setattr(tuning, "confirm", lambda model, linears, plan: plan)
    return measured


def first_load(checkpoint, models):
    return load_model(str(checkpoint), models_dir=models, progress=False)


@needs_blas
def test_a_first_load_in_a_world_writable_models_folder_writes_through_no_planted_link(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """The attack: another user who can write the models folder plants links at the plan's temporary names
    (the old predictable `.kernel-plan-<hash>.json.<pid>.tmp` for thousands of pids, and every name the
    writer draws now before a free one). A first load writes the plan: no file outside the folder changes,
    and the plan is a file of this user's own, not the other user's link."""
    models, outside = tmp_path / "models", tmp_path / "home"
    models.mkdir()
    outside.mkdir()
    os.chmod(models, 0o777)
    victim = outside / ".bashrc"
    victim.write_text("the user's own file\n")
    plan = tuning.plan_file(models)
    for pid in range(max(1, os.getpid() - 2000), os.getpid() + 2000):
        (models / f".{plan.name}.{pid}.tmp").symlink_to(victim)
    draws = iter(f"{i:016x}" for i in range(10_000))
    monkeypatch.setattr(safe_io.write, "_random_name", lambda: next(draws))
    for i in range(safe_io.write.TEMPORARY_TRIES - 1):
        (models / f".{plan.name}.{i:016x}.tmp").symlink_to(victim)

    first_load(tiny_checkpoint, models)

    assert victim.read_text() == "the user's own file\n", "written through a planted link"
    assert not plan.is_symlink() and stat.S_ISREG(plan.lstat().st_mode), "the plan is a planted link"
    assert plan.stat().st_uid == os.geteuid() and stat.S_IMODE(plan.stat().st_mode) == 0o644
    assert tuning.read_plan(plan), "and it is trusted on the next load"
    assert all(p.is_symlink() and p.resolve() == victim for p in models.iterdir() if p != plan)


def write_raw_plan(path, plans: dict, **changes):
    data = {
        "format": tuning.FORMAT,
        "version": tuning.VERSION,
        "machine": tuning.machine(),
        "buckets": list(M_BUCKETS),
        "plans": plans,
        **changes,
    }
    path.write_text(json.dumps(data))


def good_plans(checkpoint, models) -> dict:
    first_load(checkpoint, models)
    return json.loads(tuning.plan_file(models).read_text())["plans"]


@needs_blas
@pytest.mark.parametrize(
    "why",
    [
        "others can write it",
        "10,000 entries",
        "an escape sequence in a key",
        "a key not of a shape",
        "a FIFO",
        "a link to /dev/zero",
        "a link to /dev/urandom",
        "a link to another user's good plan",
    ],
)
def test_a_plan_file_not_of_this_user_s_making_is_measured_again_at_once(
    tiny_checkpoint, tmp_path, why, split_and_fake_timing
):
    measured = split_and_fake_timing
    models = tmp_path / "models"
    plans = good_plans(tiny_checkpoint, models)
    plan = tuning.plan_file(models)
    kernels.PLANS.clear()
    plan.unlink()
    if why == "others can write it":
        write_raw_plan(plan, plans)
        os.chmod(plan, 0o666)
    elif why == "10,000 entries":
        write_raw_plan(
            plan, {**plans, **{f"{i + 1}x{i + 1}/float32/2": ["blas"] * len(M_BUCKETS) for i in range(10_000)}}
        )
    elif why == "an escape sequence in a key":
        write_raw_plan(plan, {**plans, "\x1b]0;owned\x07": ["blas"] * len(M_BUCKETS)})
    elif why == "a key not of a shape":
        write_raw_plan(plan, {**plans, "576x576/float32/2; rm -rf": ["blas"] * len(M_BUCKETS)})
    elif why == "a FIFO":
        os.mkfifo(plan)
    elif why == "a link to another user's good plan":
        good = tmp_path / "elsewhere.json"
        write_raw_plan(good, plans)
        plan.symlink_to(good)
    else:
        plan.symlink_to("/dev/zero" if "zero" in why else "/dev/urandom")
    assert tuning.read_plan(plan) == {}
    before = len(measured)
    done = threading.Event()
    threading.Thread(target=lambda: (first_load(tiny_checkpoint, models), done.set()), daemon=True).start()
    assert done.wait(30), f"a plan file that is {why} hangs the load"
    assert len(measured) == before + 1, f"a plan file that is {why} must be measured again"


@needs_blas
@as_root
def test_a_plan_owned_by_another_user_is_not_trusted(tiny_checkpoint, tmp_path, split_and_fake_timing):
    models = tmp_path / "models"
    plans = good_plans(tiny_checkpoint, models)
    plan = tuning.plan_file(models)
    assert tuning.read_plan(plan) == plans
    os.chown(plan, 4321, 4321)
    assert tuning.read_plan(plan) == {}, "another user's plan (neither the folder's owner nor the user loading)"
    os.chown(models, 4321, 4321)
    assert tuning.read_plan(plan) == plans, "the models folder's owner's plan is trusted"
