"""A store alone in a process, so a test can measure its memory (``psutil``) from outside.

Arguments: TOKEN (``-`` for none) MAX_FRAME MAX_BUFFERED FRAME_TIMEOUT_S. Prints
``{"port": ..., "pid": ...}``; then, for each line on stdin, the server's counters as JSON.
The process ends when stdin closes.
"""

from __future__ import annotations

import json
import os
import sys

from cclctl.store.client import StoreServer
from cclctl.store.limits import StoreLimits


def main() -> None:
    token, max_frame, max_buffered, frame_timeout = sys.argv[1:5]
    limits = StoreLimits(
        max_frame=int(max_frame),
        max_buffered=int(max_buffered),
        frame_timeout_s=float(frame_timeout),
    )
    with StoreServer(token=None if token == "-" else token, limits=limits) as server:
        print(json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
        for _ in sys.stdin:
            counts = {"rejected": server.rejected, "connections": server.connections}
            print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
