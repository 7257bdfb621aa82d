"""The status publisher: a daemon thread that keeps ``status/<rank>`` fresh in the job's store.

``cclctl top`` and hang diagnosis read these records from a live job, so a rank that stops
publishing is itself a finding (dead, stopped or cut off). The publisher must therefore never be the
reason a job fails: store errors are counted, logged at debug level and retried next tick
(the store client reopens a lost connection by itself). Once it publishes again after a gap
(failed turns, or a reconnect), its status says so: ``gap_s`` (how long readers saw nothing
new) and ``reconnects`` go into the counters, so a stale status is explained by the rank.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from cclctl.periodic import STOP_TIMEOUT_S, Periodic

log = logging.getLogger("cclctl.telemetry")


class StatusStore(Protocol):
    """What the publisher needs from the job's store (job namespacing is the store's concern)."""

    def set(self, key: str, value: bytes) -> None: ...


#: A turn that follows the last good one by more than this many intervals ends a gap.
GAP_INTERVALS = 2.0


class StatusPublisher:
    """Calls ``payload()`` every ``interval_s`` and stores the bytes under ``key``.

    ``payload`` builds the status document (and bumps the heartbeat); it runs on the
    publisher's thread so the training thread never pays for JSON encoding.
    """

    def __init__(
        self,
        store: StatusStore,
        key: str,
        payload: Callable[[], bytes],
        interval_s: float,
    ) -> None:
        self.store = store
        self.key = key
        self.interval_s = interval_s
        self.errors = 0
        self.published = 0
        self.last_error = ""
        self.gap_s = 0.0  # the last gap between two good publishes, once it has ended
        self._last_ok: float | None = None
        self._payload = payload
        # first and last: a status as soon as the rank starts, and final seqs and counters
        # as it stops
        self._thread = Periodic("cclctl-status", self._turn, interval_s, first=True, last=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def reconnects(self) -> int:
        """Connections the store client reopened (0 for a store that does not count)."""
        count = getattr(self.store, "reconnects", 0)
        return count if isinstance(count, int) else 0

    def publish(self) -> bool:
        """Publish once now; False (and one more error counted) if the store refused."""
        try:
            self.store.set(self.key, self._payload())
        except Exception as exc:  # never let a store problem reach the job
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.debug("cclctl: publishing %s failed: %s", self.key, self.last_error)
            return False
        self._ended()
        self.published += 1
        return True

    def _ended(self) -> None:
        """Note a gap that this publish ends: since the last good one, more than
        :data:`GAP_INTERVALS` intervals went by (the next status carries it)."""
        last, self._last_ok = self._last_ok, time.monotonic()
        if last is not None and self._last_ok - last > GAP_INTERVALS * self.interval_s:
            self.gap_s = round(self._last_ok - last, 3)
            log.info("cclctl: %s published again after %.1fs", self.key, self.gap_s)

    def _turn(self) -> None:
        self.publish()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the thread after one final publish; waits at most ``timeout_s`` for it."""
        self._thread.stop(timeout_s)
