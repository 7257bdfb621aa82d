"""Transports: the interface algorithms use, the wire header, TCP, shared memory, hybrid."""
