"""The job's control plane: a small TCP key-value store, its server, client and wire format."""
