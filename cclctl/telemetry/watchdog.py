"""The hang watchdog: one thread per process that watches every in-flight collective.

It only reads in-memory records, so it never blocks on a dead peer. Past half the timeout it
warns once; past the timeout it marks the record ``timed_out``, counts the hang, dumps the
flight recorder, publishes the status at once and logs one line naming the collective and
the peer this rank waits on. ``on_expire`` runs on every expiry, whatever the policy: the
runtime hands the hang to the communicator's failure state there, which applies the policy
(``raise``: the blocked call raises :class:`~cclctl.errors.CollectiveTimeout`; ``abort``:
:class:`~cclctl.errors.CommAborted`; ``wait``: keep waiting), and asks every rank of the
job to dump. ``on_abort`` runs under the ``abort`` policy only (the torch integration
aborts its process group there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from cclctl.periodic import Periodic
from cclctl.records import STARTED, TIMED_OUT, CollectiveRecord

log = logging.getLogger("cclctl.watchdog")


class Watched(Protocol):
    """What the watchdog needs from telemetry (see :class:`~cclctl.telemetry.hub.Telemetry`)."""

    rank: int

    def inflight(self) -> list[CollectiveRecord]: ...
    def count_hang(self, comm: str, op: str) -> None: ...
    def dump(self, reason: str, path: str | None = None) -> str | None: ...
    def publish_now(self) -> bool: ...


def describe_wait(rank: int, rec: CollectiveRecord, age_s: float) -> str:
    """One line an SRE can act on: which collective, how long, and whom this rank waits on."""
    where = f"rank {rank}: {rec.op} seq {rec.seq} on comm {rec.comm} ({rec.nbytes} bytes)"
    if rec.waiting_on is not None:
        direction = "to" if rec.waiting_for == "send" else "from"
        who = f"waiting to {rec.waiting_for} {direction} rank {rec.waiting_on}"
    else:
        who = "not waiting on any peer"
    return f"{where} has run {age_s:.1f}s, {who}"


class Watchdog:
    def __init__(
        self,
        telemetry: Watched,
        timeout_s: float,
        policy: str = "raise",
        on_abort: Callable[[CollectiveRecord, str], None] | None = None,
        on_expire: Callable[[CollectiveRecord, str], None] | None = None,
        period_s: float | None = None,
        clock: Callable[[], int] = time.time_ns,
        outcome: str = "",
    ) -> None:
        self._telemetry = telemetry
        self.timeout_ns = int(timeout_s * 1e9)
        self.policy = policy
        #: what follows an expiry, in words, for the log line ("": ``policy <policy>``);
        #: the torch integration says what torch does, as nothing of cclctl's can raise there
        self.outcome = outcome or f"policy {policy}"
        self._on_abort = on_abort
        self._on_expire = on_expire
        self._period_s = period_s if period_s is not None else min(1.0, max(timeout_s / 10, 0.05))
        self._clock = clock
        self._warned: set[int] = set()
        self._thread: Periodic | None = None

    def start(self) -> Watchdog:
        self._thread = Periodic("cclctl-watchdog", self._turn, self._period_s).start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()

    def _turn(self) -> None:
        self.check(self._clock())

    def check(self, now_ns: int) -> list[CollectiveRecord]:
        """Look at every in-flight record once; return those that timed out just now."""
        expired = []
        live = set()
        for rec in self._telemetry.inflight():
            if rec.state != STARTED:
                continue
            key = id(rec)
            live.add(key)
            age = now_ns - rec.start_ns
            if age >= self.timeout_ns:
                expired.append(rec)
                self._expire(rec, age / 1e9)
            elif age >= self.timeout_ns // 2 and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "cclctl: slow collective: %s",
                    describe_wait(self._telemetry.rank, rec, age / 1e9),
                )
        self._warned &= live
        return expired

    def _expire(self, rec: CollectiveRecord, age_s: float) -> None:
        tel = self._telemetry
        line = describe_wait(tel.rank, rec, age_s)
        rec.state = TIMED_OUT
        rec.error = f"timed out after {age_s:.1f}s"
        tel.count_hang(rec.comm, rec.op)
        path = tel.dump("hang")
        tel.publish_now()
        suffix = f"; flight recorder dumped to {path}" if path else ""
        log.error("cclctl: HANG: %s; %s%s", line, self.outcome, suffix)
        if self._on_expire is not None:
            self._on_expire(rec, line)
        if self.policy == "abort" and self._on_abort is not None:
            self._on_abort(rec, f"watchdog: {line}")
