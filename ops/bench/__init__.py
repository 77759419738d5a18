"""Benchmarks, run as commands (`python -m ops.bench.<name>`), never as timed tests."""
