"""The log: NATS JetStream streams, the embedded server, append / read / subscribe."""
