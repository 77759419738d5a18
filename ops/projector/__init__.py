"""The projector: CRR_EVENTS → the pure fold → CRR_SNAPSHOT (its run loop in `service`, and its
parts)."""
