"""The store's resource limits, and how it reports what they cost a client.

Every limit closes (or refuses) one connection and never the store: the event is counted on
the server (``StoreServer.rejected``, by reason, which the rank's exporter shows) and told
in one log line per reason, at most once a minute, never as a traceback in the job's output.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import resource
import time

from cclctl.store.protocol import DEFAULT_MAX_FRAME_BYTES, MAX_FIELDS

log = logging.getLogger("cclctl.store")

#: Why a connection was closed (the ``reason`` label of the rejection counter).
REASONS = (
    "frame_too_large",  # a frame's header declared more than the connection may send
    "fields",  # a frame declared more fields than the store accepts
    "frame_timeout",  # a frame did not arrive whole within frame_timeout_s of its first byte
    "idle",  # a connection without the token said nothing for idle_timeout_s
    "evicted",  # the oldest idle connection, dropped to make room at max_connections
    "full",  # a new connection while max_connections are busy
    "memory",  # partial frames of all connections together reached max_buffered
    "bad_proof",  # a wrong answer to the token's challenge
    "malformed",  # a request no client of ours sends
    "accept_error",  # the kernel refused an accept (out of file descriptors, ...)
)

NOTICE_EVERY_S = 60.0


@dataclasses.dataclass(frozen=True)
class StoreLimits:
    """What one client may cost the store. Defaults fit a job of 10,000 ranks."""

    max_frame: int = DEFAULT_MAX_FRAME_BYTES  # bytes of one request (CCLCTL_STORE_MAX_FRAME)
    max_fields: int = MAX_FIELDS
    max_buffered: int = 0  # bytes of partial frames, all connections (0: 4 x max_frame)
    frame_timeout_s: float = 30.0  # a frame must arrive whole within this of its first byte
    idle_timeout_s: float = 60.0  # a connection without the token's proof, saying nothing
    max_connections: int = 16384  # also at most 3/4 of the process's file descriptors

    @property
    def buffered_cap(self) -> int:
        return self.max_buffered or 4 * self.max_frame

    def connection_cap(self) -> int:
        """max_connections, or fewer where the file-descriptor limit would be hit first."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - soft // 4))

    @property
    def sweep_s(self) -> float:
        """How often deadlines are checked: a quarter of the shortest, within 50 ms .. 1 s."""
        return min(1.0, max(0.05, min(self.frame_timeout_s, self.idle_timeout_s) / 4))


class EventLog:
    """Counts closed connections and refused requests; one line per reason a minute."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.rejected: collections.Counter[str] = collections.Counter()
        self.refused = 0
        self._last_notice: dict[str, float] = {}
        self._unreported: collections.Counter[str] = collections.Counter()

    def reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        self._notice(reason, f"closed a connection: {detail}")

    def refuse(self, detail: str) -> None:
        self.refused += 1
        self._notice("refused", f"refused a request: {detail}")

    def _notice(self, kind: str, line: str) -> None:
        now = time.monotonic()
        last = self._last_notice.get(kind)
        if last is not None and now - last < NOTICE_EVERY_S:
            self._unreported[kind] += 1
            return
        self._last_notice[kind] = now
        more = self._unreported.pop(kind, 0)
        tail = f" ({more} more like it since the last notice)" if more else ""
        log.warning("cclctl store %s: %s%s", self.address, line, tail)
