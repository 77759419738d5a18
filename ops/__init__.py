"""Operator surface: the `crr` CLI, composition root, REST API, replay, examples, benchmarks."""
