"""Benchmarks: one `python -m specdec.bench` with sections; the prompt suite; plots."""
