"""A rank's way to its job's revoke record: through its host agent's fan-out while there is one.

:class:`RevokeFeed` asks the agent's fan-out (:mod:`.revoke_fanout`) for the record and
blocks until it hands one on. It never decides alone that there is none: when the agent
is not there (not started yet, never came, gone, stalled past a slice) it says so at once,
and the rank waits on the store itself (:class:`~cclctl.runtime.job.revoke_key.RevokeKey`)
until the next try to reach the agent, which comes after a pause that doubles from
:data:`FIRST_RETRY_S` to :data:`LAST_RETRY_S`. A record written while the agent was
dying is in the store, where the rank's own wait finds it: a revoke is never missed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from cclctl.runtime.hostagent.revoke_fanout import ANSWER, ASK, MAX_RECORD, SLICE_S
from cclctl.runtime.hostagent.wire import read_exact
from cclctl.runtime.socket_io import connect_unix

#: how long a connect to the agent may take
CONNECT_S = 2.0
#: beyond the agent's slice, how long an answer may be late before the agent counts as lost
LATE_S = 5.0
FIRST_RETRY_S = 0.5
LAST_RETRY_S = 30.0


class RevokeFeed:
    """A rank's subscription to the fan-out listening at ``name`` (:func:`.fanout_name`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.delivered = 0  # records the agent handed on
        self.lost = 0  # times the agent was there, then was not
        self._sock: socket.socket | None = None
        self._retry_at = 0.0
        self._pause = FIRST_RETRY_S
        self._closed = False
        self._lock = threading.Lock()

    def retry_in(self) -> float:
        """Seconds until the feed tries the agent again (0: it would now)."""
        if self._sock is not None:
            return 0.0
        return max(0.0, self._retry_at - time.monotonic())

    def next_record(self, fresh: bool) -> bytes | None:
        """Block until the agent hands on a record: its bytes as the store holds them.
        ``fresh``: the agent reads the store first (this rank handled a record before). None
        at once when no agent answers (the caller waits on the store itself), or once the
        feed is closed."""
        sock = self._connected()
        if sock is None:
            return None
        try:
            while True:
                sock.sendall(ASK.pack(1 if fresh else 0))
                fresh = False
                (length,) = ANSWER.unpack(read_exact(sock, ANSWER.size))
                if length > MAX_RECORD:
                    raise ValueError(f"the agent answered {length:,} bytes")
                if length:
                    self.delivered += 1
                    return read_exact(sock, length)
        except (OSError, ValueError):
            self._drop(lost=True)
            return None

    def _connected(self) -> socket.socket | None:
        with self._lock:
            if self._sock is not None or self._closed:
                return self._sock
            if time.monotonic() < self._retry_at:
                return None
            sock = connect_unix(self.name, CONNECT_S)
            if sock is None:
                self._later()
                return None
            sock.settimeout(SLICE_S + LATE_S)  # the agent answers within its slice
            self._sock, self._pause = sock, FIRST_RETRY_S
            return sock

    def _later(self) -> None:
        self._retry_at = time.monotonic() + self._pause
        self._pause = min(2 * self._pause, LAST_RETRY_S)

    def _drop(self, lost: bool) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
            if sock is not None and lost and not self._closed:
                self.lost += 1
                self._later()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # ends a blocking read in another thread
            sock.close()

    def close(self) -> None:
        """Stop asking: a blocking :meth:`next_record` returns None at once."""
        with self._lock:
            self._closed = True
        self._drop(lost=False)
