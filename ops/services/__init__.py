"""Long-running services and what they run on.

The projector and its parts, the scheduler view, snapshot and history reads.
"""
