"""Per-rank windows of a modelled job, for the slow-job analysis' tests.

A job of ``n`` ranks runs ``calls`` collectives per window, one every ``period`` seconds;
each rank spends ``comm_share`` of the window inside them on its own. A straggler enters
every call (or one in ``late_every``) ``lag_share`` of a period late, which the others
spend waiting inside the call (their share grows by it, its own does not), and its ring
successor records that wait as ``entry_wait_ns`` on it; over TCP (``transport="tcp"``, or
ranks on different hosts) a ring passes the wait on: each rank further down waits in the
data phase on the one before it, which waits on the straggler. Links carry ``nbytes`` per
call at ``rate`` bytes per second of data-phase wait, the sender recording ``send_share``
of it; a slow link or a slow host's egress is ``factor`` times slower, and with
``coupling`` the other links of a ring wait along with it (their receivers wait for data
the slow link holds back). A TCP link's receiver also records its messages' transfer times
(``transfer_share`` of the link's own data time; a slow link's grow by ``factor``, coupled
links' do not). Entry times get seeded uniform jitter; ``skew`` shifts a host's clock.
Deterministic for a seed.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Collection, Sequence

from cclctl.diagnose.slow_model import RankSignals
from cclctl.records import CommInfo, RankSnapshot
from cclctl.slow_signals import CommWindow, PeerWindow, Signals, Window, sample_entries

NS = 1_000_000_000
START_NS = 1_733_400_000 * NS
COMM = "0:0-3"


@dataclasses.dataclass
class Job:
    n: int = 4
    hosts: Sequence[str] | None = None
    windows: int = 4
    window_s: float = 5.0
    calls: int = 200
    comm_share: float = 0.10
    jitter_s: float = 0.002
    seed: int = 0
    # a straggler (or several), and the windows it is slow in (None: all)
    slow: Collection[int] = ()
    lag_share: float = 0.25
    slow_in: Collection[int] | None = None
    lag_seen: bool = True  # False: the sampled entries miss the late calls (aliasing)
    late_every: int = 1  # the straggler enters late one call in this many (a step's first)
    # links: "ring" (r -> r+1) or "all" (every pair, as all_to_all)
    pattern: str = "ring"
    nbytes: int = 1 << 20
    rate: float = 1e9
    slow_links: Collection[tuple[int, int]] = ()
    slow_egress: str | None = None
    factor: float = 8.0
    coupling: float = 0.0
    send_share: float = 0.3  # of a link's data-phase wait, what its sender records
    transfer_share: float = 0.8  # of a TCP link's own data time, its messages' transfer
    transport: str = "auto"  # "tcp": every link is TCP, within a host too
    untimed: Collection[tuple[int, int]] = ()  # links whose messages all arrive whole
    skew: dict[str, float] = dataclasses.field(default_factory=dict)
    # a busy machine: these ranks get extra random jitter of up to this much per call
    noisy: Collection[int] = ()
    noise_s: float = 0.0
    start_ns: int = START_NS  # the first window's start (a multiple of the window)

    @property
    def period_s(self) -> float:
        return self.window_s / self.calls

    def host(self, rank: int) -> str:
        return self.hosts[rank] if self.hosts else "h0"

    def comm(self) -> str:
        return f"0:0-{self.n - 1}"

    def active(self, window: int) -> bool:
        return self.slow_in is None or window in self.slow_in

    def via(self, src: int, dst: int) -> str:
        if self.transport == "tcp" or self.host(src) != self.host(dst):
            return "tcp"
        return "shm"


def _edges(job: Job) -> list[tuple[int, int]]:
    if job.pattern == "ring":
        return [(r, (r + 1) % job.n) for r in range(job.n)]
    return [(a, b) for a in range(job.n) for b in range(job.n) if a != b]


def _slow_edge(job: Job, src: int, dst: int) -> bool:
    if (src, dst) in job.slow_links:
        return True
    egress = job.slow_egress
    return egress is not None and job.host(src) == egress and job.host(dst) != egress


def _window(job: Job, rank: int, index: int, rng: random.Random) -> Window:
    start = job.start_ns + index * int(job.window_s * NS)
    end = start + int(job.window_s * NS)
    active = job.active(index)
    late = rank in job.slow and active
    lag = job.lag_share if active and job.slow else 0.0
    share = job.comm_share + (0.0 if late else lag) + rng.uniform(-0.01, 0.01)
    entries = []
    skew = job.skew.get(job.host(rank), 0.0)
    for k in range(job.calls):
        t = index * job.window_s + k * job.period_s + rng.uniform(0, job.jitter_s) + skew
        if late and job.lag_seen and k % job.late_every == 0:
            t += job.lag_share * job.period_s
        if rank in job.noisy:
            t += rng.uniform(0, job.noise_s)
        entries.append((index * job.calls + k + 1, job.start_ns + int(t * NS)))
    comm = CommWindow(job.calls, int(max(0.0, share) * job.window_s * NS), sample_entries(entries))
    return Window(start, end, {job.comm(): comm}, _peers(job, rank, index, rng))


def _wait_ns(job: Job, src: int, dst: int, index: int) -> int:
    """The data-phase wait of link src -> dst over the window (both ends together)."""
    base = job.calls * job.nbytes / job.rate
    if not job.active(index):
        return int(base * NS)
    if _slow_edge(job, src, dst):
        return int(base * job.factor * NS)
    slowed = any(_slow_edge(job, a, b) for a, b in _edges(job))
    return int(base * (1 + (job.factor - 1) * job.coupling * slowed) * NS)


def _transfer_ns(job: Job, src: int, dst: int, index: int) -> int:
    """The time src's messages took to reach dst over the window, first byte to last."""
    if job.via(src, dst) != "tcp" or (src, dst) in job.untimed:
        return 0
    own = job.calls * job.nbytes / job.rate * job.transfer_share
    slowed = job.active(index) and _slow_edge(job, src, dst)
    return int(own * (job.factor if slowed else 1.0) * NS)


def _chained(job: Job, src: int, index: int) -> bool:
    """Whether src, downstream of a straggler in a TCP ring, waits on it along the chain
    (its receivers then wait on src in the data phase)."""
    if job.pattern != "ring" or not job.active(index) or src in job.slow:
        return False
    return any(job.via(r, (r + 1) % job.n) == "tcp" for r in range(job.n)) and bool(job.slow)


def _peers(job: Job, rank: int, index: int, rng: random.Random) -> dict[int, PeerWindow]:
    peers: dict[int, PeerWindow] = {}
    lateness = job.calls * job.lag_share * job.period_s * NS
    for src, dst in _edges(job):
        if rank not in (src, dst):
            continue
        other = dst if rank == src else src
        old = peers.get(other, PeerWindow(job.via(src, dst)))
        wait = _wait_ns(job, src, dst, index) * rng.uniform(0.9, 1.1)
        volume = job.calls * job.nbytes
        if rank == src:
            old.sent, old.send_wait_ns = volume, int(wait * job.send_share)
        else:
            old.received, old.recv_wait_ns = volume, int(wait * (1 - job.send_share))
            old.recv_transfer_ns = int(_transfer_ns(job, src, dst, index) * rng.uniform(0.9, 1.1))
            if src in job.slow and job.active(index):
                old.entry_wait_ns = int(lateness)
                if old.via == "tcp":  # a late peer's first steps arrive late too
                    old.recv_wait_ns += int(lateness * 0.15)
            elif _chained(job, src, index):  # src waited on its own upstream as long
                old.recv_wait_ns += int(lateness * rng.uniform(0.95, 1.05))
        peers[other] = old
    return peers


def signals(job: Job) -> list[RankSignals]:
    """Every rank's windows, as the analysis reads them."""
    out = []
    for rank in range(job.n):
        rng = random.Random(job.seed * 1000 + rank)
        windows = tuple(_window(job, rank, i, rng) for i in range(job.windows))
        out.append(RankSignals(rank, job.host(rank), job.window_s, windows, pid=1000 + rank))
    return out


def documents(job: Job, kind: str = "dump", name: str = "j") -> list[RankSnapshot]:
    """The ranks' dumps (or statuses) carrying their windows, as the hub writes them."""
    out = []
    for rank in signals(job):
        newest = rank.windows[-1].end_ns if rank.windows else job.start_ns
        out.append(
            RankSnapshot(
                kind=kind,
                job=name,
                rank=rank.rank,
                world_size=job.n,
                host=rank.host,
                pid=rank.pid,
                time_ns=newest,
                comms={job.comm(): CommInfo(list(range(job.n)), 10, 10)},
                reason="test",
                signals=Signals(job.window_s, list(rank.windows)),
            )
        )
    return out


def ending_now(**fields: object) -> Job:
    """A job whose newest window ended just now (statuses a live reader finds fresh)."""
    job = Job(**fields)  # type: ignore[arg-type]
    width = int(job.window_s * NS)
    job.start_ns = (time.time_ns() // width - job.windows) * width
    return job
