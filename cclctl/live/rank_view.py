"""What the live view shows of a job: each rank's state and flags (:class:`RankView`), the
job's ranks in order (:class:`JobView`), and the thresholds they are judged by; the
judging is :mod:`cclctl.live.classify`'s."""

from __future__ import annotations

import dataclasses

from cclctl.records import CollectiveRecord, CommInfo

OK = "ok"
IN_COLLECTIVE = "in_collective"
WAITING = "waiting"
STALE = "stale"
MISSING = "missing"
ERROR = "error"
DONE = "done"
STATES = (OK, IN_COLLECTIVE, WAITING, STALE, MISSING, ERROR, DONE)
#: Flags: each is a reason a rank looks wrong. "failed": its in-flight call failed or timed out.
FLAGS = ("missing", "bad_status", "stale", "failed", "slow", "behind", "errors", "hangs")

#: The same as ``cclctl diagnose hang``'s defaults (stale after, stuck after), so a rank the
#: table flags and the verdict above it are judged by one clock.
DEFAULT_STALE_S = 10.0
DEFAULT_SLOW_S = 5.0


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When a heartbeat is stale and when a collective has lasted too long (seconds)."""

    stale_s: float = DEFAULT_STALE_S
    slow_s: float = DEFAULT_SLOW_S


@dataclasses.dataclass(frozen=True)
class RankView:
    """One rank as the view shows it; ages are seconds as of the fetch (None: unknown)."""

    rank: int
    state: str
    flags: tuple[str, ...] = ()
    host: str = ""
    pid: int = 0
    heartbeat_age_s: float | None = None
    inflight: CollectiveRecord | None = None
    inflight_age_s: float | None = None
    comms: dict[str, CommInfo] = dataclasses.field(default_factory=dict)
    behind: dict[str, int] = dataclasses.field(default_factory=dict)  # comm -> seq others wait in
    busbw_gbps: dict[str, float] = dataclasses.field(default_factory=dict)
    collectives: int = 0
    errors: int = 0
    retries: int = 0
    resumes: int = 0  # links made again inside a call after a reset (nothing re-run)
    hangs: int = 0
    error: str = ""
    metrics_url: str = ""
    store_reconnects: int = 0  # its publisher's store connection, reopened after a loss
    store_gap_s: float = 0.0  # the last time its statuses stopped, once they came back

    @property
    def wrong(self) -> bool:
        return bool(self.flags)

    @property
    def last_completed(self) -> int:
        return max((c.last_completed for c in self.comms.values()), default=0)


@dataclasses.dataclass(frozen=True)
class JobView:
    """Every rank of one job, wrong ranks first and then by rank.

    ``world_size_source`` says where the world size came from: "rendezvous", "flag",
    "status" (the ranks' own documents) or "ranks" (the highest rank seen, plus one).
    """

    job: str
    address: str
    fetched_ns: int
    world_size: int
    world_size_source: str
    thresholds: Thresholds
    ranks: list[RankView]

    @property
    def seen(self) -> int:
        return sum(1 for r in self.ranks if r.state != MISSING)

    @property
    def wrong(self) -> int:
        return sum(1 for r in self.ranks if r.wrong)

    @property
    def missing(self) -> list[int]:
        return sorted(r.rank for r in self.ranks if r.state == MISSING)
