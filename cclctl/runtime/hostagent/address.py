"""Where a host's agent listens: an abstract Unix socket named after the user, job and host.

An abstract socket (Linux) has no file to clean up, no path length to outgrow, and belongs to
its network namespace, as a host's ranks do. It has no file permissions either: the agent
lets in only processes of its own user (``SO_PEERCRED``, :func:`peer_uid`).
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct

_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def socket_name(job: str, host: str, uid: int | None = None) -> str:
    """The agent's abstract socket name for ``job`` on ``host`` (this user's by default)."""
    uid = os.getuid() if uid is None else uid
    digest = hashlib.sha256(f"{uid}\0{job}\0{host}".encode()).hexdigest()[:32]
    return f"\0cclctl-agent-{digest}"


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    return int(_CREDENTIALS.unpack(raw)[1])
