"""Admin: forgetting hosts and reporters, NATS authorization, health and liveness over the
snapshot."""
