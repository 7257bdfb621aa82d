"""The status publisher: a daemon thread that keeps ``status/<rank>`` fresh in the job's store.

``cclctl top`` and hang diagnosis read these records from a live job, so a rank that stops
publishing is itself a finding (dead or frozen). The publisher must therefore never be the
reason a job fails: store errors are counted, logged at debug level and retried next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from cclctl.periodic import STOP_TIMEOUT_S, Periodic

log = logging.getLogger("cclctl.telemetry")


class StatusStore(Protocol):
    """What the publisher needs from the job's store (job namespacing is the store's concern)."""

    def set(self, key: str, value: bytes) -> None: ...


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
        self._payload = payload
        # first and last: a status as soon as the rank starts, and final seqs and counters
        # as it stops
        self._thread = Periodic("cclctl-status", self._turn, interval_s, first=True, last=True)

    def start(self) -> None:
        self._thread.start()

    def publish(self) -> bool:
        """Publish once now; False (and one more error counted) if the store refused."""
        try:
            self.store.set(self.key, self._payload())
        except Exception as exc:  # never let a store problem reach the job
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.debug("cclctl: publishing %s failed: %s", self.key, self.last_error)
            return False
        self.published += 1
        return True

    def _turn(self) -> None:
        self.publish()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the thread after one final publish; waits at most ``timeout_s`` for it."""
        self._thread.stop(timeout_s)
