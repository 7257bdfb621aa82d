"""The address a rank advertises for its links: the local one that routes to the job's store."""

from __future__ import annotations

import socket


def local_address_towards(host: str) -> str:
    """The local IP address that routes to ``host`` (the store), to advertise to peers."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
        target = str(infos[0][4][0])
    except OSError:
        return "127.0.0.1"
    if target.startswith("127."):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((target, 9))  # no packet is sent for a UDP connect
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()
