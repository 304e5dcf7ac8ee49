"""Where downloads go: one default folder whatever the current directory (SPECDEC_HOME
moves it), one copy per Hub repo, a line saying what is about to be downloaded, and no
empty model folder left behind when nothing arrived."""

from __future__ import annotations

import pytest
from conftest import tiny_model, write_checkpoint

from specdec.checkpoints.download import DownloadError
from specdec.checkpoints.folders import CHECKPOINT_FILES
from specdec.checkpoints.hub import resolve_model
from specdec.checkpoints.load import load_model
from specdec.checkpoints.settings import default_models_dir


def test_default_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_models_dir() == tmp_path / "home" / ".cache" / "specdec" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_models_dir() == tmp_path / "xdg" / "specdec" / "models"
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "sd"))
    assert default_models_dir() == tmp_path / "sd" / "models"
    monkeypatch.chdir(tmp_path)  # the current directory plays no part
    assert resolve_model("124M") == (tmp_path / "sd" / "models" / "openai-community--gpt2", "openai-community/gpt2")


def test_short_name_and_repo_id_share_one_folder(tmp_path):
    assert resolve_model("124M", tmp_path) == resolve_model("openai-community/gpt2", tmp_path)
    assert resolve_model("distilgpt2", tmp_path)[0] == tmp_path / "distilbert--distilgpt2"


def test_a_complete_folder_under_the_short_name_is_still_used(tmp_path):
    legacy = write_checkpoint(tmp_path / "355M", tiny_model())
    assert resolve_model("355M", tmp_path)[0] == legacy
    (legacy / CHECKPOINT_FILES[1]).unlink()  # incomplete: the repo folder is the place to download into
    assert resolve_model("355M", tmp_path)[0] == tmp_path / "openai-community--gpt2-medium"


def test_an_empty_models_dir_is_refused():
    with pytest.raises(ValueError, match="models_dir is empty"):
        resolve_model("124M", "")


def test_download_says_what_and_where_and_labels_its_bars(fake_hub, tmp_path, capsys):
    fake_hub.add_checkpoint("openai-community/gpt2", write_checkpoint(tmp_path / "src", tiny_model()))
    load_model("124M", tmp_path / "models", progress=True)
    err = capsys.readouterr().err
    folder = tmp_path / "models" / "openai-community--gpt2"
    assert f"downloading openai-community/gpt2 (about 548.0 MB) from {fake_hub.url} into {folder}" in err
    assert "openai-community--gpt2/model.safetensors" in err  # the progress bar's label names the model
    load_model("openai-community/gpt2", tmp_path / "models", progress=True)  # the same files: no second download
    assert "downloading" not in capsys.readouterr().err


def test_no_empty_folder_is_left_after_a_failed_download(fake_hub, tmp_path):
    with pytest.raises(DownloadError, match="404"):
        load_model("tiny-org/missing", tmp_path, progress=False)
    assert not (tmp_path / "tiny-org--missing").exists()


def test_main_times_the_download_apart_from_the_load(fake_hub, tmp_path, capsys):
    from specdec.cli import main

    fake_hub.add_checkpoint("org/tiny", write_checkpoint(tmp_path / "src", tiny_model()))
    argv = [
        "--target_model_size",
        "org/tiny",
        "--draft",
        "ngram",
        "--models_dir",
        str(tmp_path / "models"),
        "--n_tokens_to_generate",
        "4",
        "--no_warmup",
    ]
    assert main.main(argv) == 0
    captured = capsys.readouterr()
    assert f"downloading org/tiny from {fake_hub.url} into {tmp_path / 'models' / 'org--tiny'}" in captured.err
    out = captured.out
    assert "(downloaded org/tiny in " in out and out.index("(downloaded") < out.index("loaded in")
    assert main.main(argv) == 0  # the second run finds the files: nothing downloaded, nothing said about it
    assert "downloaded" not in capsys.readouterr().out


def test_a_dead_network_points_to_the_shipped_models(tmp_path):
    import socket

    from specdec.checkpoints import family
    from specdec.checkpoints.settings import HubSettings

    with socket.socket() as s:  # a port nothing listens on: every request is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = HubSettings(endpoint=f"http://127.0.0.1:{port}", retries=0, timeout=2)
    with pytest.raises(DownloadError, match=f"--target_model_size {family.TARGET} --draft {family.DRAFT}"):
        load_model("org/model", tmp_path, progress=False, settings=settings)
    load_model(family.TARGET, tmp_path, progress=False, settings=settings)  # and they load with no network


def test_an_endpoint_that_is_not_a_url_is_refused_before_any_work(monkeypatch, tmp_path):
    from specdec.checkpoints.settings import HubSettings

    monkeypatch.setenv("HF_ENDPOINT", "notaurl")
    with pytest.raises(ValueError, match="HF_ENDPOINT must be a URL"):
        HubSettings.from_env()
    with pytest.raises(ValueError, match="HF_ENDPOINT must be a URL"):
        load_model("124M", tmp_path / "models", progress=False)
    assert not (tmp_path / "models").exists()
