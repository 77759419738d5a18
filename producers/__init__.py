"""Producers of events: the worker agent, the script runner, the external reporter SDK,
and the simulators."""
