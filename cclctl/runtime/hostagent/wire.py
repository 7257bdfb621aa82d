"""What a rank and its agent say: the rank sends its status (its rank and the document's
bytes); the agent answers each with its news for the host's ranks (a JSON object: the job's
dump requests, as the agent last read them from the store)."""

from __future__ import annotations

import struct

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
