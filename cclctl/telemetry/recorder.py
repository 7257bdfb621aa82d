"""The hot path: what the runtime calls around every collective.

One short critical section per call, guarded by a plain ``threading.Lock`` (uncontended it
costs ~0.1 µs), so counters stay exact when several threads drive collectives and readers
(scrapes, the status publisher, dumps) get a consistent copy. Nothing here formats strings
or allocates beyond what bookkeeping needs; readers do the expensive work on their copies.
"""

from __future__ import annotations

import threading
from bisect import bisect_left

from cclctl.bandwidth import bus_factor
from cclctl.records import COMPLETED, FINAL_STATES, CollectiveRecord, CommInfo
from cclctl.telemetry.counters import DURATION_BOUNDS_NS, CommState, CommView, OpStats


class Recorder:
    """Flight recorder and counters of one process.

    Each communicator keeps a bounded ring of its recent records (``ring_size``, 0 = off).
    The ring holds the caller's own record objects, so fields the runtime updates in place
    while a call blocks (``step``, ``waiting_on``) show up in dumps without extra calls.
    Point-to-point records (``peer`` set) carry a per-pair seq, so they do not move the
    communicator's last started/completed seq.
    """

    def __init__(self, ring_size: int) -> None:
        self._lock = threading.Lock()
        self._ring_size = max(0, ring_size)
        self._comms: dict[str, CommState] = {}
        self._inflight: dict[int, CollectiveRecord] = {}  # id(record) -> record
        self._links: dict[int, list[int]] = {}  # peer -> [sent, received]

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

    def start(self, rec: CollectiveRecord) -> None:
        """``rec`` has begun: it becomes in flight and enters its communicator's ring."""
        with self._lock:
            cs = self._comms.get(rec.comm) or self._comm(rec.comm)
            cs.ring.append(rec)
            self._inflight[id(rec)] = rec
            if rec.peer is None and rec.seq > cs.last_started:
                cs.last_started = rec.seq

    def finish(self, rec: CollectiveRecord, world_size: int) -> None:
        """``rec`` has ended (its ``state`` and ``end_ns`` are final): count it.

        A completed call feeds collectives, bytes, bus bytes, busy time and the histogram;
        any other final state counts one error whose reason is that state (``failed``,
        ``aborted``, ``timed_out``).
        """
        ns = rec.end_ns - rec.start_ns
        if ns < 0:  # wall clocks can step back; counters must not
            ns = 0
        with self._lock:
            self._inflight.pop(id(rec), None)
            cs = self._comms.get(rec.comm) or self._comm(rec.comm)
            st = cs.ops.get(rec.op) or self._op(rec.comm, rec.op)
            if rec.state != COMPLETED:
                st.errors[rec.state] = st.errors.get(rec.state, 0) + 1
                return
            if st.factor_n != world_size:
                st.factor = bus_factor(rec.op, world_size)
                st.factor_n = world_size
            bus = rec.nbytes * st.factor
            st.collectives += 1
            st.bytes += rec.nbytes
            st.bus_bytes += bus
            st.busy_ns += ns
            st.buckets[bisect_left(DURATION_BOUNDS_NS, ns)] += 1
            st.last_bus_bytes = bus
            st.last_ns = ns
            st.last_end_ns = rec.end_ns
            if rec.peer is None and rec.seq > cs.last_completed:
                cs.last_completed = rec.seq

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
            records = list(self._inflight.values())
        records.sort(key=lambda r: r.start_ns)
        return records

    def records(self) -> list[CollectiveRecord]:
        """Every record still in the rings, plus any in flight the rings no longer hold
        (or never held, with the ring off), in start order across communicators.
        """
        with self._lock:
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
            return {
                name: CommInfo(list(cs.ranks), cs.last_started, cs.last_completed)
                for name, cs in self._comms.items()
            }

    def failures(self) -> int:
        """Errors plus hangs counted so far (decides whether exit deserves a dump)."""
        with self._lock:
            return sum(
                st.error_count + st.hangs for cs in self._comms.values() for st in cs.ops.values()
            )

    def copy_counters(
        self,
    ) -> tuple[dict[tuple[str, str], OpStats], list[CommView], dict[int, tuple[int, int]]]:
        """Copies of the op counters, per-communicator gauges and link bytes, all at once."""
        with self._lock:
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
