"""Everything that talks to NATS: subjects, connection, streams, publishing, tracing."""
