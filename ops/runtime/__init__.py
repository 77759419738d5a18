"""Runtime tricks for long-running processes: telemetry, shutdown, the heap and the cyclic GC."""
