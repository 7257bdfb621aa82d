"""Blocking socket reads and connects the runtime's small protocols share: a link's
handshake between ranks, and a rank's conversations with its host agent."""

from __future__ import annotations

import socket


def recv_exact(sock: socket.socket, size: int, closed: str) -> bytes:
    """``size`` bytes from ``sock``; ConnectionResetError(``closed``) where the other end
    closed it first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError(closed)
        data += chunk
    return data


def connect_unix(name: str, timeout_s: float | None) -> socket.socket | None:
    """A connection to the Unix socket ``name`` (abstract where it starts with a NUL), its
    timeout ``timeout_s``; None where nothing listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(name)
    except OSError:
        sock.close()
        return None
    return sock
