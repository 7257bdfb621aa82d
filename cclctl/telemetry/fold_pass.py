"""The fold's one pass: queued records moved into their rings, each counted or kept in flight.

:class:`~.recorder.Recorder` runs it under its lock (see that module for why counting is
deferred to a fold). The pass reads each record once, while it is in cache, and sums a run
of records of one (comm, op) in locals before it writes the counters (:func:`.counters.add_run`).
"""

from __future__ import annotations

import collections
from bisect import bisect_left
from collections.abc import Callable

from cclctl.records import COMPLETED, CollectiveRecord
from cclctl.telemetry.counters import DURATION_BOUNDS_NS, CommState, OpStats, add_run

#: The state of a communicator and the counters of one of its ops, created on first use.
StatsOf = Callable[[str, str], tuple[CommState, OpStats]]


def take_queued(
    queue: collections.deque[CollectiveRecord],
    inflight: dict[int, CollectiveRecord],
    stats_of: StatsOf,
    world_size: int,
) -> list[CollectiveRecord]:
    """Move every queued record into its ring, counting those that have ended and keeping
    the rest in ``inflight`` (the recorder's lock is held); returns them in order.

    One pass, summing in locals over each run of records of one (comm, op), written
    back when the run ends: each record is read once, while it is in cache (records
    are cold after a large reduction).
    """
    bounds = DURATION_BOUNDS_NS
    popleft = queue.popleft
    comm, op = queue[0].comm, queue[0].op
    cs, st = stats_of(comm, op)
    keep, buckets = cs.ring.append, st.buckets
    calls = nbytes = busy = started = done = 0
    last = None
    taken: list[CollectiveRecord] = []
    took = taken.append
    for _ in range(len(queue)):
        rec = popleft()
        took(rec)
        if rec.op is not op or rec.comm is not comm:  # a new run (identity: the usual)
            add_run(cs, st, world_size, calls, nbytes, busy, last, started, done)
            calls = nbytes = busy = started = done = 0
            last = None
            comm, op = rec.comm, rec.op
            cs, st = stats_of(comm, op)
            keep, buckets = cs.ring.append, st.buckets
        keep(rec)
        end = rec.end_ns
        seq = 0
        if rec.peer is None:  # point-to-point seqs are per pair: not the comm's
            seq = rec.seq
            if seq > started:
                started = seq
        if not end:
            inflight[id(rec)] = rec
            continue
        if rec.state != COMPLETED:
            st.errors[rec.state] = st.errors.get(rec.state, 0) + 1
            continue
        ns = end - rec.start_ns
        if ns < 0:  # wall clocks can step back; counters must not
            ns = 0
        if rec.stages:  # a relayed call (runtime/relay): rare, so tested, not summed in locals
            st.add_stages(rec.stages)
        calls += 1
        nbytes += rec.nbytes
        busy += ns
        buckets[bisect_left(bounds, ns)] += 1
        last = rec
        if seq > done:
            done = seq
    add_run(cs, st, world_size, calls, nbytes, busy, last, started, done)
    return taken


def count_ended(rec: CollectiveRecord, stats_of: StatsOf, world_size: int) -> None:
    """Count one ended record that an earlier fold left in flight (the recorder's lock is
    held): a completed call feeds the throughput counters and the histogram, any
    other final state counts one error whose reason is that state.
    """
    cs, st = stats_of(rec.comm, rec.op)
    if rec.state != COMPLETED:
        st.errors[rec.state] = st.errors.get(rec.state, 0) + 1
        return
    ns = max(0, rec.end_ns - rec.start_ns)
    st.buckets[bisect_left(DURATION_BOUNDS_NS, ns)] += 1
    if rec.stages:
        st.add_stages(rec.stages)
    seq = rec.seq if rec.peer is None else 0
    add_run(cs, st, world_size, 1, rec.nbytes, ns, rec, 0, seq)
