"""The hot path: what the runtime calls around every collective.

Bookkeeping is deferred. :attr:`Recorder.start` and :attr:`Recorder.finish` are bare
``deque.append`` methods (C-level calls, atomic under the GIL, no lock, no Python frame).
The queued records are folded into the rings, the in-flight set and the counters under the
lock by :meth:`Recorder.fold`, which the caller runs every ``FOLD_BATCH`` calls and every
reader (a scrape, a status, a dump, the watchdog) runs before it looks. Readers therefore
always see exact counters, and a collective pays two appends.

Why: on 1 MiB all_reduces (``benchmarks/telemetry_on_off.py``) the reduction evicts the
interpreter's and the counters' cache lines, so doing the bookkeeping per call cost 8-10 µs
there (against ~2 µs warm). Folding the queue in one go runs that code warm, once per few
hundred calls.
"""

from __future__ import annotations

import collections
import threading
from bisect import bisect_left
from collections.abc import Callable

from cclctl.bandwidth import bus_factor
from cclctl.records import COMPLETED, FINAL_STATES, STARTED, CollectiveRecord, CommInfo
from cclctl.telemetry.counters import DURATION_BOUNDS_NS, CommState, CommView, OpStats

#: How many calls a caller lets queue before it runs :meth:`Recorder.fold` (the runtime's
#: communicator and the PyTorch integration do; readers fold before they look).
FOLD_BATCH = 256


class Recorder:
    """Flight recorder and counters of one process.

    Each communicator keeps a bounded ring of its recent records (``ring_size``, 0 = off).
    The ring holds the caller's own record objects, so fields the runtime updates in place
    while a call blocks (``step``, ``waiting_on``) show up in dumps without extra calls.
    Point-to-point records (``peer`` set) carry a per-pair seq, so they do not move the
    communicator's last started/completed seq.
    """

    def __init__(self, ring_size: int, world_size: int = 1) -> None:
        """``world_size`` sizes communicators never declared with :meth:`register_comm`."""
        self._lock = threading.Lock()
        self._ring_size = max(0, ring_size)
        self._comms: dict[str, CommState] = {}
        self._inflight: dict[int, CollectiveRecord] = {}  # id(record) -> record
        self._links: dict[int, list[int]] = {}  # peer -> [sent, received]
        self._started: collections.deque[CollectiveRecord] = collections.deque()
        self._finished: collections.deque[CollectiveRecord] = collections.deque()
        self._world_size = world_size
        #: ``rec`` has begun: queue it for its ring and the in-flight set.
        self.start: Callable[[CollectiveRecord], None] = self._started.append
        #: ``rec`` has ended (its ``state`` and ``end_ns`` are final): queue it to be counted.
        self.finish: Callable[[CollectiveRecord], None] = self._finished.append

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

    def fold(self) -> None:
        """Count every queued record now (callers run it every ``FOLD_BATCH`` calls)."""
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        """Move queued starts into the rings (and, while still running, the in-flight set),
        then count queued finishes; the caller holds the lock.

        Only the finishes queued before the starts are drained are taken, so every record
        counted here has been started here first, even while the hot path keeps appending.
        A record whose state is already final is not in flight, whether its finish is
        counted now or at the next fold.
        """
        started, finished, inflight = self._started, self._finished, self._inflight
        ready = len(finished)
        name, cs = "", None
        for _ in range(len(started)):
            rec = started.popleft()
            if rec.comm != name or cs is None:
                name, cs = rec.comm, self._comms.get(rec.comm) or self._comm(rec.comm)
            cs.ring.append(rec)
            if rec.state == STARTED:
                inflight[id(rec)] = rec
            if rec.peer is None and rec.seq > cs.last_started:
                cs.last_started = rec.seq
        if ready:
            self._count([finished.popleft() for _ in range(ready)])

    def _count(self, done: list[CollectiveRecord]) -> None:
        """Count finished records (the caller holds the lock).

        A completed call feeds collectives, bytes, bus bytes, busy time and the histogram;
        any other final state counts one error whose reason is that state (``failed``,
        ``aborted``, ``timed_out``). Records are grouped by (comm, op) first, and each
        group is summed in locals and written once.
        """
        inflight = self._inflight
        groups: dict[tuple[str, str], list[CollectiveRecord]] = {}
        for rec in done:
            if inflight:
                inflight.pop(id(rec), None)
            group = groups.get((rec.comm, rec.op))
            if group is None:
                groups[(rec.comm, rec.op)] = [rec]
            else:
                group.append(rec)
        for (comm, op), group in groups.items():
            cs = self._comms.get(comm) or self._comm(comm)
            st = cs.ops.get(op) or self._op(comm, op)
            world_size = len(cs.ranks) or self._world_size
            if st.factor_n != world_size:
                st.factor = bus_factor(op, world_size)
                st.factor_n = world_size
            buckets, calls, nbytes, busy, seq, last = st.buckets, 0, 0, 0, 0, None
            for rec in group:
                if rec.state != COMPLETED:
                    st.errors[rec.state] = st.errors.get(rec.state, 0) + 1
                    continue
                ns = rec.end_ns - rec.start_ns
                if ns < 0:  # wall clocks can step back; counters must not
                    ns = 0
                calls += 1
                nbytes += rec.nbytes
                busy += ns
                buckets[bisect_left(DURATION_BOUNDS_NS, ns)] += 1
                last = rec
                if rec.peer is None and rec.seq > seq:
                    seq = rec.seq
            if last is not None:
                st.collectives += calls
                st.bytes += nbytes
                st.bus_bytes += nbytes * st.factor
                st.busy_ns += busy
                st.last_bus_bytes = last.nbytes * st.factor
                st.last_ns = max(0, last.end_ns - last.start_ns)
                st.last_end_ns = last.end_ns
                if seq > cs.last_completed:
                    cs.last_completed = seq

    def link_bytes(self, peer: int, sent: int, received: int) -> None:
        """Add bytes sent to and received from ``peer`` (per message or per collective)."""
        with self._lock:
            link = self._links.get(peer)
            if link is None:
                link = self._links[peer] = [0, 0]
            link[0] += sent
            link[1] += received

    def count_error(self, comm: str, op: str, reason: str) -> None:
        """Count an error that no :meth:`finish` reports (e.g. a failed connect).

        A record finished in a failed state is already counted; do not count it twice.
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

    def failures(self) -> int:
        """Errors plus hangs counted so far (decides whether exit deserves a dump)."""
        with self._lock:
            self._fold()
            return sum(
                st.error_count + st.hangs for cs in self._comms.values() for st in cs.ops.values()
            )

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
