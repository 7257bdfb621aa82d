"""Where a host's agent listens: an abstract Unix socket named after the user, the job's run
(its name, its store's address and its token: a rerun of a job name, or another job's store,
never finds an earlier run's lingering agent) and the host.

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


def socket_name(
    job: str, host: str, store: str = "", token: str = "", uid: int | None = None
) -> str:
    """The agent's abstract socket name for the run of ``job`` whose store is at ``store``
    (with ``token``) on ``host`` (this user's by default)."""
    uid = os.getuid() if uid is None else uid
    run = "\0".join((str(uid), job, host, store, token))
    digest = hashlib.sha256(run.encode()).hexdigest()[:32]
    return f"\0cclctl-agent-{digest}"


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    return int(_CREDENTIALS.unpack(raw)[1])


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket (what an error names)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    return int(_CREDENTIALS.unpack(raw)[0])


def rendezvous_name(name: str) -> str:
    """The socket of the agent's rendezvous service, beside its status socket ``name``."""
    return f"{name}-rdzv"
