"""Where downloaded models live and how the Hub is reached: the environment, read in one place.

Where models_dir is, when not given: the same folder whatever the current
directory, as huggingface_hub keeps its cache in ~/.cache/huggingface:
    $SPECDEC_HOME/models            when SPECDEC_HOME is set
    $XDG_CACHE_HOME/specdec/models  when XDG_CACHE_HOME is set
    ~/.cache/specdec/models         otherwise

The Hub's variables, read by `HubSettings.from_env` with the meanings huggingface_hub gives them:
    HF_ENDPOINT     base URL of the Hub or a mirror (default https://huggingface.co)
    HF_HUB_OFFLINE  1/ON/YES/TRUE: never touch the network; use local files only
    HF_TOKEN        sent as a bearer token, for gated or private repos
    HF_HUB_DOWNLOAD_TIMEOUT  seconds to wait for the server to answer (default 10)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class HubSettings:
    endpoint: str = DEFAULT_ENDPOINT
    offline: bool = False
    token: str | None = None
    timeout: float = 10.0  # seconds to connect, and seconds of silence allowed mid-answer
    retries: int = 3  # after the first try: at most 4 tries, about 4 * 2 * timeout + 7 s in all
    retry_delay: float = 1.0  # doubled after each retry

    @classmethod
    def from_env(cls) -> "HubSettings":
        """The one place that reads the Hub's environment variables, as huggingface_hub does."""
        endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"HF_ENDPOINT must be a URL starting with http:// or https://, not {endpoint!r}")
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        try:
            timeout = float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10.0)
        except ValueError:
            raise ValueError("HF_HUB_DOWNLOAD_TIMEOUT must be a number of seconds") from None
        return cls(endpoint.rstrip("/"), offline, os.environ.get("HF_TOKEN") or None, timeout)

    def url(self, repo: str, filename: str) -> str:
        return f"{self.endpoint}/{repo}/resolve/main/{filename}"


def default_models_dir() -> Path:
    """Where downloaded models live when no models_dir is given (see the module docstring)."""
    if os.environ.get("SPECDEC_HOME"):
        return Path(os.environ["SPECDEC_HOME"]).expanduser() / "models"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "specdec" / "models"


def default_dir_text() -> str:
    """The default models folder, for messages: where it is and how to move it."""
    return f"({default_models_dir()}; set SPECDEC_HOME to move it)"
