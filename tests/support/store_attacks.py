"""Raw-socket clients that misbehave the way an attacker's would, for the store's tests."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

from cclctl.store.protocol import REQUEST_HEADER, Op

LENGTH = struct.Struct("!I")


def declared_frame_head(size: int, op: Op = Op.SET) -> bytes:
    """The header and field table of a one-field frame declaring ``size`` bytes of payload."""
    return REQUEST_HEADER.pack(op, -1.0, 1) + LENGTH.pack(size)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send_until_closed(sock: socket.socket, head: bytes, body_bytes: int) -> int:
    """Send ``head`` then up to ``body_bytes`` of payload, stopping when the store hangs up;
    returns the payload bytes the kernel accepted."""
    chunk = b"\0" * (1 << 20)
    sent = 0
    try:
        sock.sendall(head)
        while sent < body_bytes:
            sent += sock.send(chunk[: min(len(chunk), body_bytes - sent)])
    except OSError:  # reset or broken pipe: the store closed the connection
        pass
    return sent


def closed_by_peer(sock: socket.socket, within_s: float = 20.0) -> bool:
    """Whether the store closes ``sock`` (EOF or reset) within the time; replies are read."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def wait_until(check: Callable[[], bool], within_s: float = 20.0) -> bool:
    """Poll ``check`` until it holds or the time runs out."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
