"""The hot path: what the runtime calls around every collective.

Bookkeeping is deferred. :attr:`Recorder.start` is a bare ``deque.append`` (a C-level
call, atomic under the GIL, no lock, no Python frame) and is all a call pays: nothing is
handed over when it ends. A record has ended once its ``end_ns`` is set, and whoever closes
it sets ``end_ns`` last, after its final ``state``. :meth:`Recorder.fold` moves queued
records into the rings and either counts them (ended) or keeps them in flight (not yet),
and counts those in flight that have ended since. The caller runs it every ``FOLD_BATCH``
calls, and every reader (a scrape, a status, a dump, the watchdog) runs it before it looks,
so readers always see exact counters.

Why: after a large all_reduce the caches hold the reduction's data, not the interpreter's,
so what a call costs here is counted in distinct memory touched, not in instructions: one
append touches the least, and counting per call would touch every counter cold. Folding
runs the counting code warm, once per few hundred calls.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from cclctl.records import FINAL_STATES, CollectiveRecord, CommInfo
from cclctl.slow_signals import Signals
from cclctl.telemetry.counters import CommState, CommView, OpStats
from cclctl.telemetry.fold_pass import count_ended, take_queued
from cclctl.telemetry.windows import Windows

#: How many calls a caller lets queue before it runs :meth:`Recorder.fold` (the runtime's
#: communicator and the PyTorch integration fold when a record's seq is a multiple of it;
#: readers fold before they look).
FOLD_BATCH = 256


class Recorder:
    """Flight recorder and counters of one process.

    Each communicator keeps a bounded ring of its recent records (``ring_size``, 0 = off).
    The ring holds the caller's own record objects, so fields the runtime updates in place
    while a call blocks (``step``, ``waiting_on``) show up in dumps without extra calls.
    Point-to-point records (``peer`` set) carry a per-pair seq, so they do not move the
    communicator's last started/completed seq.

    A record counts as ended once ``end_ns`` is non-zero; closers must set it last (see
    :func:`cclctl.runtime.comm.tracing.close_record`), so a fold in another thread that sees it
    also sees the record's final state.
    """

    def __init__(self, ring_size: int, world_size: int = 1, windows: Windows | None = None) -> None:
        """``world_size`` sizes communicators never declared with :meth:`register_comm`;
        ``windows`` are the slowness signals' windows every fold feeds (None: none kept)."""
        self._lock = threading.Lock()
        self._ring_size = max(0, ring_size)
        self._comms: dict[str, CommState] = {}
        self._inflight: dict[int, CollectiveRecord] = {}  # id(record) -> record
        self._links: dict[int, list[int]] = {}  # peer -> [sent, received]
        self._queue: collections.deque[CollectiveRecord] = collections.deque()
        self._world_size = world_size
        #: ``rec`` has begun: queue it for its ring, and to be counted once it has ended.
        self.start: Callable[[CollectiveRecord], None] = self._queue.append
        #: the slowness signals' windows, fed by every fold (None: none kept)
        self.windows = windows

    def _comm(self, comm: str) -> CommState:
        """The state of ``comm``, created on first use; the caller holds the lock."""
        cs = self._comms.get(comm)
        if cs is None:
            cs = self._comms[comm] = CommState([], self._ring_size)
        return cs

    def _op(self, comm: str, op: str) -> OpStats:
        """The counters of (``comm``, ``op``), created on first use; the caller holds the lock."""
        cs = self._comms.get(comm) or self._comm(comm)
        st = cs.ops.get(op)
        if st is None:
            st = cs.ops[op] = OpStats()
        return st

    def register_comm(self, comm: str, ranks: list[int]) -> None:
        """Declare a communicator and its member ranks (again after a shrink: updates them)."""
        with self._lock:
            self._comm(comm).ranks = list(ranks)

    def queued(self) -> int:
        """How many started records wait for the next fold (no lock: a deque's length)."""
        return len(self._queue)

    def fold(self) -> None:
        """Count every queued record now (callers run it every ``FOLD_BATCH`` calls)."""
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        """Count the calls in flight that have ended since the last fold, then move queued
        records into the rings and count or keep each; the caller holds the lock.

        The slowness signals' windows are only handed the records taken: :meth:`signals`
        adds them (each status, outside this lock), so what the windows cost runs beside
        the calls, not in them.

        ``end_ns`` is read once per record and decides: a record that ends just after it
        was looked at stays in flight and is counted by the next fold, never twice.
        """
        inflight = self._inflight
        if inflight:
            for key, rec in list(inflight.items()):
                if rec.end_ns:
                    del inflight[key]
                    count_ended(rec, self._stats, self._world_size)
        if self._queue:
            taken = take_queued(self._queue, inflight, self._stats, self._world_size)
            windows = self.windows
            if windows is not None:
                windows.defer(taken)

    def _stats(self, comm: str, op: str) -> tuple[CommState, OpStats]:
        """The state of ``comm`` and the counters of its ``op``, created on first use."""
        cs = self._comms.get(comm) or self._comm(comm)
        return cs, cs.ops.get(op) or self._op(comm, op)

    def link_bytes(self, peer: int, sent: int, received: int) -> None:
        """Add bytes sent to and received from ``peer`` (per message or per collective)."""
        with self._lock:
            link = self._links.get(peer)
            if link is None:
                link = self._links[peer] = [0, 0]
            link[0] += sent
            link[1] += received

    def count_error(self, comm: str, op: str, reason: str) -> None:
        """Count an error that no record reports (e.g. a failed connect).

        A record that ended in a failed state is already counted; do not count it twice.
        """
        with self._lock:
            st = self._op(comm, op)
            st.errors[reason] = st.errors.get(reason, 0) + 1

    def count_retry(self, comm: str, op: str) -> None:
        """Count one retry of a collective (fault tolerance re-ran it under a new epoch)."""
        with self._lock:
            self._op(comm, op).retries += 1

    def count_hang(self, comm: str, op: str) -> None:
        """Count one collective the watchdog found past its timeout."""
        with self._lock:
            self._op(comm, op).hangs += 1

    def inflight(self) -> list[CollectiveRecord]:
        """The records now in flight, oldest first (the same objects the runtime updates)."""
        with self._lock:
            self._fold()
            records = list(self._inflight.values())
        records.sort(key=lambda r: r.start_ns)
        return records

    def records(self) -> list[CollectiveRecord]:
        """Every record still in the rings, plus any in flight the rings no longer hold
        (or never held, with the ring off), in start order across communicators.
        """
        with self._lock:
            self._fold()
            records = [r for cs in self._comms.values() for r in cs.ring]
            held = {id(r) for r in records}
            records += [r for key, r in self._inflight.items() if key not in held]
        records.sort(key=lambda r: (r.start_ns, r.comm, r.seq))
        return records

    def last_finished(self) -> list[CollectiveRecord]:
        """The most recent finished record of each communicator (from its ring).

        A status carries these beside the in-flight records, so a live reader sees a call
        that failed (a mismatch, a broken link) and not only calls still running.
        """
        with self._lock:
            self._fold()
            found = []
            for cs in self._comms.values():
                for rec in reversed(cs.ring):
                    if rec.state in FINAL_STATES:
                        found.append(rec)
                        break
        return found

    def comm_infos(self) -> dict[str, CommInfo]:
        """Members and last started/completed seq of every communicator."""
        with self._lock:
            self._fold()
            return {
                name: CommInfo(list(cs.ranks), cs.last_started, cs.last_completed)
                for name, cs in self._comms.items()
            }

    def signals(self) -> Signals | None:
        """The slowness signals' complete windows (None: none kept), after a fold."""
        with self._lock:
            self._fold()
        windows = self.windows
        return None if windows is None else windows.update()

    def failures(self) -> int:
        """Errors plus hangs counted so far (decides whether exit deserves a dump)."""
        with self._lock:
            self._fold()
            return sum(
                st.error_count + st.hangs for cs in self._comms.values() for st in cs.ops.values()
            )

    def recovered(self) -> int:
        """How many of :meth:`failures` a retry re-ran: per communicator, its errors up to
        its agreed retries (each retry re-ran one failed attempt of every rank in it; an
        attempt that failed again, or that no retry followed, stays a failure).

        Counted per communicator, not per op, since a rank that was closing counts its
        retry under ``close``. A hang is never recovered.
        """
        with self._lock:
            self._fold()
            total = 0
            for cs in self._comms.values():
                errors = sum(st.error_count for st in cs.ops.values())
                total += min(errors, sum(st.retries for st in cs.ops.values()))
            return total

    def copy_counters(
        self,
    ) -> tuple[dict[tuple[str, str], OpStats], list[CommView], dict[int, tuple[int, int]]]:
        """Copies of the op counters, per-communicator gauges and link bytes, all at once."""
        with self._lock:
            self._fold()
            ops = {(c, op): st.copy() for c, cs in self._comms.items() for op, st in cs.ops.items()}
            starts: dict[str, int] = {}
            for rec in self._inflight.values():
                first = starts.get(rec.comm)
                if first is None or rec.start_ns < first:
                    starts[rec.comm] = rec.start_ns
            comms = [
                CommView(name, cs.last_started, cs.last_completed, starts.get(name, 0))
                for name, cs in self._comms.items()
            ]
            links = {peer: (s, r) for peer, (s, r) in self._links.items()}
        return ops, comms, links
