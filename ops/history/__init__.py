"""History: replay, the host timeline and latency, read from the retained CRR_EVENTS."""
