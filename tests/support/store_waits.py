"""Waiting in tests until the store holds a blocked request, instead of sleeping."""

from __future__ import annotations

import time

from cclctl.store.server import StoreServer


def until_waiting(server: StoreServer, key: str, count: int = 1, within_s: float = 10) -> None:
    """Return once ``count`` requests wait for ``key`` in ``server``; fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while server.state.waiting(key.encode()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests wait for {key!r}"
        time.sleep(0.005)
