"""The one message a rank sends its agent: its status, as its rank and the document's bytes."""

from __future__ import annotations

import struct

HEADER = struct.Struct(">II")  # rank, length of the status document
#: the largest status an agent takes (a status is tens of KB; a bigger frame is a bug or abuse)
MAX_STATUS = 4 << 20


def status_frame(rank: int, doc: bytes) -> bytes:
    return HEADER.pack(rank, len(doc)) + doc
