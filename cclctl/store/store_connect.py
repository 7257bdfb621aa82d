"""A new connection to a store, retried until a deadline: ranks routinely start before
the store is up, and a client whose connection was lost reopens it (:mod:`~.channel`).
"""

from __future__ import annotations

import socket
import time

from cclctl.errors import StoreTimeout


def reason(exc: BaseException) -> str:
    """Why a socket call failed, in words (the OS's, else the error's)."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def connect(
    host: str, port: int, connect_timeout_s: float, max_retry_delay_s: float,
    refused_is_final: bool = False,
) -> socket.socket:  # fmt: skip
    """A connection to the store at ``host:port``, retried (backing off up to
    ``max_retry_delay_s``) until ``connect_timeout_s`` has passed, then StoreTimeout.
    ``refused_is_final``: a refused connection raises ConnectionRefusedError at once
    (after a loss: nothing listens any more, the store has gone)."""
    deadline = time.monotonic() + connect_timeout_s
    delay = 0.01
    while True:
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(min(remaining, 5.0), 0.05))
        except OSError as exc:
            if refused_is_final and isinstance(exc, ConnectionRefusedError):
                raise
            if time.monotonic() + delay >= deadline:
                raise StoreTimeout(
                    f"cannot reach the store at {host}:{port} after "
                    f"{connect_timeout_s:g}s: {reason(exc)}",
                    address=f"{host}:{port}",
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, max_retry_delay_s)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
