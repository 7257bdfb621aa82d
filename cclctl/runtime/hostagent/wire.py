"""What a rank and its agent say: the rank sends its status (its rank and the document's
bytes); the agent answers each with its news for the host's ranks (a JSON object: the job's
dump requests, as the agent last read them from the store). The agent's other sockets
(rendezvous, revoke) answer with frames read the same way (:func:`read_exact`,
:func:`read_object`)."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from cclctl.runtime.socket_io import recv_exact

HEADER = struct.Struct(">II")  # rank, length of the status document
NEWS = struct.Struct(">I")  # length of the agent's answer
#: the largest answer a rank takes
MAX_NEWS = 64 << 10
#: the largest status an agent takes (a status is tens of KB; a bigger frame is a bug or abuse)
MAX_STATUS = 4 << 20


def status_frame(rank: int, doc: bytes) -> bytes:
    return HEADER.pack(rank, len(doc)) + doc


def news_frame(news: bytes) -> bytes:
    return NEWS.pack(len(news)) + news


def read_exact(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``; ConnectionResetError where the agent closed it first."""
    return recv_exact(sock, size, "the host agent closed the connection")


def read_object(sock: socket.socket, header: struct.Struct, limit: int) -> dict[str, Any]:
    """A JSON object after its length in ``header``: what the agent answers a rank; a
    ValueError where it is over ``limit`` bytes or not a JSON object."""
    (length,) = header.unpack(read_exact(sock, header.size))
    if length > limit:
        raise ValueError(f"the agent answered {length:,} bytes")
    answer = json.loads(read_exact(sock, length))
    if not isinstance(answer, dict):
        raise ValueError("the agent's answer is not a JSON object")
    return answer
