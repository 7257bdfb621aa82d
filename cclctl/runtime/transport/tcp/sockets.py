"""A link's sockets: the listening one a rank's peers connect to, and a linked one as the
steps use it."""

from __future__ import annotations

import contextlib
import socket

from cclctl.errors import CommError
from cclctl.runtime.transport.tcp import stall

SOCKET_BUFFER = 4 << 20


def prepare(sock: socket.socket, stall_ms: int) -> None:
    """A linked socket as steps use it: no Nagle, large buffers, probed, non-blocking."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):  # a capped limit is fine, just slower
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
    if stall_ms:
        stall.keep_probing(sock, stall_ms)
    sock.setblocking(False)


def listen(host: str, rank: int, world_size: int) -> socket.socket:
    """This rank's listening socket on ``host``, at a port the system picks."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, 0))
    except OSError as exc:
        listener.close()
        raise CommError(f"rank {rank}: cannot listen on {host}: {exc}", rank=rank) from None
    listener.listen(max(128, world_size + 16))
    return listener
