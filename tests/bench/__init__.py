"""Benchmarks, run as commands (`python -m tests.bench.<name>`), never as timed tests."""
