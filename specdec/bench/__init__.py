"""Benchmarks: one `python -m specdec.bench` with sections; the prompt suite; plots.

Layer: the top. May import anything in specdec; nothing in specdec imports it
(tests/test_imports.py).
"""
