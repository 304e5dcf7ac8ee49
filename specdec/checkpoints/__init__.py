"""Checkpoints: from a name or a file on disk to a ready model (load.load_model), and what is kept on disk.

Readers for each kind of file (safetensors.py, gguf.py, hf_llama.py, load.py's GPT-2
folders), where files come from (hub.py, wheel.py with its pins.py, family.py's models
and draft.py's distilled SmolLM2 draft shipped inside specdec), which model a trained file
belongs to (fingerprint.py), what is known of a name before a download (names.py), and the
disk they use (layout.py, store.py, locks.py, pairs.py).

May import: model/, words.py (message text) and the modules of checkpoints/ itself; nothing above (the round,
drafters, training, benchmarks) (tests/test_imports.py checks this).
"""
