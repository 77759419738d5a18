"""Scheduler bridges (`crr bridge …`): crr's snapshot turned into a scheduler's own node facts.

`door.Door` is the port a target implements (NFD feature file, HTCondor startd
cron, LSF elim, Slurm); `engine.Engine` plans, diffs and applies; see docs/bridges.md.
"""
