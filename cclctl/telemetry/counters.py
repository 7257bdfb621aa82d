"""Plain counter cells the hot path bumps and scrapes copy.

Counters are ordinary Python numbers in slotted objects, keyed by communicator then op, so
recording a collective costs a few attribute updates: no label lookups, no string formatting.
Exporters and status summaries read copies taken at scrape time (see :mod:`.recorder`).
"""

from __future__ import annotations

import collections
import dataclasses

from cclctl.bandwidth import bus_factor
from cclctl.probe_record import ProbeRecord
from cclctl.records import ABORTED, FAILED, TIMED_OUT, CollectiveRecord

#: Upper bounds of the duration histogram in nanoseconds: 1-2-5 steps from 10 µs to 100 s.
#: Integers so the hot path bisects record timestamps without converting to float.
# fmt: off
DURATION_BOUNDS_NS: tuple[int, ...] = (
    10_000, 20_000, 50_000,
    100_000, 200_000, 500_000,
    1_000_000, 2_000_000, 5_000_000,
    10_000_000, 20_000_000, 50_000_000,
    100_000_000, 200_000_000, 500_000_000,
    1_000_000_000, 2_000_000_000, 5_000_000_000,
    10_000_000_000, 20_000_000_000, 50_000_000_000,
    100_000_000_000,
)
# fmt: on

#: The final states a collective can end in other than completed: the ``reason`` of its
#: error. Known up front, so the exporter serves a zero series for each from the start.
ERROR_REASONS: tuple[str, ...] = (FAILED, ABORTED, TIMED_OUT)


class OpStats:
    """Everything counted for one (communicator, op) pair.

    Only completed collectives feed the throughput counters and the histogram, so that
    ``rate(bus bytes) / rate(seconds)`` is the bandwidth of work that actually finished.
    ``buckets`` holds per-bucket (not cumulative) counts; the last one is +Inf.
    """

    __slots__ = (
        "buckets",
        "bus_bytes",
        "busy_ns",
        "bytes",
        "collectives",
        "errors",
        "factor",
        "factor_n",
        "hangs",
        "last_bus_bytes",
        "last_end_ns",
        "last_ns",
        "retries",
        "stage_ns",
    )

    def __init__(self) -> None:
        self.collectives = 0
        self.bytes = 0
        self.bus_bytes = 0.0
        self.busy_ns = 0
        self.errors: dict[str, int] = {}
        self.hangs = 0
        self.retries = 0
        self.buckets = [0] * (len(DURATION_BOUNDS_NS) + 1)
        self.factor = 0.0  # bus factor cached for world size ``factor_n``
        self.factor_n = -1
        self.last_bus_bytes = 0.0
        self.last_ns = 0
        self.last_end_ns = 0
        #: a relayed op's nanoseconds per stage (records' ``stages``), summed
        self.stage_ns: dict[str, int] = {}

    def copy(self) -> OpStats:
        other = OpStats()
        for name in OpStats.__slots__:
            setattr(other, name, getattr(self, name))
        other.errors = dict(self.errors)
        other.buckets = list(self.buckets)
        other.stage_ns = dict(self.stage_ns)
        return other

    def add_stages(self, stages: dict[str, int]) -> None:
        """Add a completed relayed call's stage times."""
        for name, ns in stages.items():
            self.stage_ns[name] = self.stage_ns.get(name, 0) + ns

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def last_busbw_gbps(self) -> float:
        """Bus bandwidth of the last completed call (bytes/ns is GB/s)."""
        return self.last_bus_bytes / self.last_ns if self.last_ns > 0 else 0.0


class CommState:
    """One communicator as this process sees it: members, progress, ring and counters.

    The ring is a ``deque`` with ``maxlen``, so appending evicts the oldest record in O(1);
    a ``maxlen`` of 0 turns the flight recorder off without a branch in the hot path.
    """

    __slots__ = ("last_completed", "last_started", "ops", "ranks", "ring")

    def __init__(self, ranks: list[int], ring_size: int) -> None:
        self.ranks = list(ranks)
        self.last_started = 0
        self.last_completed = 0
        self.ops: dict[str, OpStats] = {}
        self.ring: collections.deque[CollectiveRecord] = collections.deque(maxlen=ring_size)


def add_run(
    cs: CommState,
    st: OpStats,
    world_size: int,
    calls: int,
    nbytes: int,
    busy_ns: int,
    last: CollectiveRecord | None,
    started: int,
    done: int,
) -> None:
    """Write one run of records' sums into the counters of its communicator ``cs`` and op
    ``st``: ``calls`` completed calls of ``nbytes`` bytes and ``busy_ns`` in all, ``last``
    the latest of them (None: none completed), and the highest collective seqs the run
    started and completed. ``world_size`` sizes a communicator whose members are unknown.
    """
    if started > cs.last_started:
        cs.last_started = started
    if last is None:
        return
    world_size = len(cs.ranks) or world_size
    if st.factor_n != world_size:
        st.factor = bus_factor(last.op, world_size)
        st.factor_n = world_size
    st.collectives += calls
    st.bytes += nbytes
    st.bus_bytes += nbytes * st.factor
    st.busy_ns += busy_ns
    st.last_bus_bytes = last.nbytes * st.factor
    st.last_ns = max(0, last.end_ns - last.start_ns)
    st.last_end_ns = last.end_ns
    if done > cs.last_completed:
        cs.last_completed = done


@dataclasses.dataclass(frozen=True, slots=True)
class CommView:
    """Per-communicator gauges as of one scrape; ``inflight_start_ns`` is 0 when idle."""

    comm: str
    last_started: int
    last_completed: int
    inflight_start_ns: int


@dataclasses.dataclass(frozen=True)
class MetricsView:
    """A consistent copy of every counter, taken under the recorder's lock in one go."""

    job: str
    rank: int
    host: str
    backend: str
    version: str
    ops: dict[tuple[str, str], OpStats]
    comms: list[CommView]
    links: dict[int, tuple[int, int]]  # peer -> (sent, received)
    heartbeat_ns: int
    publish_errors: int
    link_auth_failures: int = 0  # link handshakes refused (see runtime/transport/tcp/links.py)
    store_reconnects: int = 0  # the publisher's store connection, reopened after a loss
    store_gap_s: float = 0.0  # the last gap between two good publishes (see status.py)
    #: peer -> its links made again after a reset (see runtime/transport/tcp/resume.py)
    link_resumes: dict[int, int] = dataclasses.field(default_factory=dict)
    #: peer -> nanoseconds blocked on it: (send, recv, entry send, entry recv), see
    #: telemetry/windows.py; only the peers this rank waited on
    peer_waits: dict[int, tuple[int, int, int, int]] = dataclasses.field(default_factory=dict)
    #: On the rank that hosts the job's store: its closed connections by reason, and the
    #: requests it refused to clients without the token; None elsewhere.
    store: StoreCounts | None = None
    #: The last probe this rank published (rank 0 of a probe run inside the job), else None.
    probe: ProbeRecord | None = None


@dataclasses.dataclass(frozen=True)
class StoreCounts:
    """What the job's store turned away (read from the store server at scrape time)."""

    rejected: dict[str, int]
    refused: int


def summarize(view: MetricsView) -> dict[str, object]:
    """The small counters summary a status record carries (``cclctl top`` shows it)."""
    ops = view.ops.values()
    busbw: dict[str, float] = {}
    latest: dict[str, int] = {}
    for (_, op), st in view.ops.items():  # per op, the most recent call over all comms
        if st.last_ns and st.last_end_ns >= latest.get(op, 0):
            latest[op] = st.last_end_ns
            busbw[op] = round(st.last_busbw_gbps, 6)
    return {
        "collectives": sum(st.collectives for st in ops),
        "bytes": sum(st.bytes for st in ops),
        "errors": sum(st.error_count for st in ops),
        "retries": sum(st.retries for st in ops),
        "link_resumes": sum(view.link_resumes.values()),
        "hangs": sum(st.hangs for st in ops),
        "last_busbw_gbps": busbw,
        "publish_errors": view.publish_errors,
        "store_reconnects": view.store_reconnects,
        "store_gap_s": view.store_gap_s,
    }
