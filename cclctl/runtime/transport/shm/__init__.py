"""Shared memory within one host: segments, slot rings, futex wake-ups, the group's state."""
