"""What the slow-job analysis reads and says: per-rank windows in, findings out.

The input is the ``signals`` field of status documents and dumps (:mod:`cclctl.slow_signals`),
one :class:`RankSignals` per rank: complete windows cut on the rank's own clock, each with
per-communicator call counts, time inside calls and sampled entry times, and per-peer
bytes and waits. The output is a :class:`SlowReport`, the versioned ``cclctl.slow``
document: findings of kind ``slow_rank`` (a compute straggler), ``slow_link`` (one
directed link) and ``slow_host`` (every link out of or into one host, or all its ranks),
each with its evidence and an estimate of what it costs the job. Plain values only, so the
analysis is tested with factories and gives the same document for the same input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from cclctl.slow_signals import Window

SLOW_SCHEMA = "cclctl.slow"
SLOW_VERSION = 1

SLOW_RANK = "slow_rank"
SLOW_LINK = "slow_link"
SLOW_HOST = "slow_host"
KINDS = (SLOW_RANK, SLOW_LINK, SLOW_HOST)

SLOW = "slow"  # a finding
HEALTHY = "healthy"  # judged, nothing found
UNJUDGED = "unjudged"  # too young, too idle or no signals: the reason says which


def span_ns(window: Window) -> int:
    """A window's length on its rank's clock (at least 1 ns)."""
    return max(1, window.end_ns - window.start_ns)


@dataclasses.dataclass(frozen=True)
class RankSignals:
    """One rank's windows, oldest first, and where it runs (the document's ``host``)."""

    rank: int
    host: str
    window_s: float
    windows: Sequence[Window]
    pid: int = 0


@dataclasses.dataclass(frozen=True)
class SlowOptions:
    """Thresholds of the analysis.

    ``min_slowdown``: the least estimated job slowdown worth a finding (1.15: 15%).
    ``confirm``: consecutive windows a suspect must be found in. ``min_calls``: calls of a
    communicator each rank must end in a window (and sampled entries the ranks share) for
    the window to count. ``last_share``: the share of shared sampled calls a straggler
    must enter last. ``mad_k``: how many scaled MADs of the others' values an outlier lies
    beyond. ``link_ratio``: a slow link's throughput is at most the reference's over this.
    ``skew_s``: the clock skew tolerated between hosts: an entry on another host counts as
    later only when it is later by more than this (entries on one host share a clock).
    ``ongoing``: only suspects found in the newest judged window count (live: what is
    slow now, not what was slow a minute ago).

    ``sustained_slowdown`` and ``confirm_sustained``: a straggler (a rank, or a host's ranks)
    that costs the job less than ``min_slowdown`` but at least this much (1.05: 5%) is a
    finding when it is found in ``confirm_sustained`` consecutive windows, each time on the
    same evidence (its share inside calls below the others' by ``mad_k`` MADs, and it
    arrives last). A smaller effect needs a longer run of the same verdict, as a sequential
    test does: by chance a rank is the window's odd one out now and then, never window after
    window. ``sustained_slowdown`` at or above ``min_slowdown`` turns this off.
    """

    min_slowdown: float = 1.15
    confirm: int = 2
    min_calls: int = 4
    last_share: float = 0.6
    mad_k: float = 3.0
    link_ratio: float = 2.0
    skew_s: float = 0.002
    ongoing: bool = True
    sustained_slowdown: float = 1.05
    confirm_sustained: int = 5

    @property
    def min_share(self) -> float:
        """The share of a window a suspect must cost the job to reach ``min_slowdown``."""
        return 1.0 - 1.0 / self.min_slowdown

    @property
    def sustained_share(self) -> float:
        """The least share of a window a straggler may cost the job and still be a finding
        (over ``confirm_sustained`` windows): ``sustained_slowdown``'s, at most ``min_share``."""
        return min(self.min_share, 1.0 - 1.0 / self.sustained_slowdown)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class SlowFinding:
    """One suspect, confirmed over ``windows`` consecutive windows."""

    kind: str
    summary: str
    ranks: list[int]
    slowdown: float  # estimated job slowdown, e.g. 1.38 for 38% slower
    evidence: list[str]
    next_step: str
    windows: int
    link: tuple[int, int] | None = None
    host: str | None = None
    comm: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "ranks": list(self.ranks),
            "link": list(self.link) if self.link else None,
            "host": self.host,
            "comm": self.comm,
            "slowdown": round(self.slowdown, 3),
            "windows": self.windows,
            "evidence": list(self.evidence),
            "next_step": self.next_step,
        }


@dataclasses.dataclass(frozen=True)
class RankFigures:
    """A rank at a glance in the newest judged window: how long after the median it enters
    its calls (None without shared entries) and the share of the window it spent inside
    them (a straggler waits least)."""

    entry_lag_s: float | None
    wait_share: float


@dataclasses.dataclass
class SlowReport:
    """The whole answer (the ``cclctl.slow`` document, version 1: fields are only added)."""

    job: str
    source: str  # "live" or "dumps"
    status: str  # SLOW, HEALTHY or UNJUDGED
    reason: str  # one line: what was judged, or why nothing could be
    findings: list[SlowFinding]
    windows_judged: int
    window_s: float
    ranks_seen: int
    figures: dict[int, RankFigures]
    options: SlowOptions
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def slow(self) -> bool:
        return bool(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SLOW_SCHEMA,
            "version": SLOW_VERSION,
            "job": self.job,
            "source": self.source,
            "status": self.status,
            "reason": self.reason,
            "findings": [f.to_dict() for f in self.findings],
            "windows_judged": self.windows_judged,
            "window_s": self.window_s,
            "ranks_seen": self.ranks_seen,
            "ranks": {
                str(rank): {
                    "entry_lag_s": None if fig.entry_lag_s is None else round(fig.entry_lag_s, 6),
                    "wait_share": round(fig.wait_share, 4),
                }
                for rank, fig in sorted(self.figures.items())
            },
            "notes": list(self.notes),
            "options": self.options.to_dict(),
        }
