"""Name each rank's state and say why it looks wrong: pure, from fetched statuses and a clock.

The state is one word for the eye (ok, in_collective, waiting, stale, missing, error, done:
a rank that closed its communicators and exited cleanly, whose status then ages as it
should; a rank whose last status says it ended otherwise, by an uncaught exception, a
signal or after a failed call, is an error, never done); the flags are every reason to
look at a rank, so a stale rank that is also behind shows both.
"Behind" is judged against ranks that are stuck, not against the fastest rank: in a healthy
job ranks publish at different instants and always differ by a few seqs, but a rank whose
peers have waited longer than ``slow_s`` in a collective it never started is the one to see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cclctl.live.rank_view import (
    DONE,
    ERROR,
    IN_COLLECTIVE,
    MISSING,
    OK,
    STALE,
    WAITING,
    JobView,
    RankView,
    Thresholds,
)
from cclctl.live.snapshot import JobStatuses
from cclctl.records import COMPLETED, STARTED, CollectiveRecord, RankSnapshot

#: The reason in the last status of a rank that closed cleanly (older writers' ``finished``).
_CLOSED = "closed"
#: How the reason of a rank's last status starts when it ended other than cleanly
#: (``Telemetry.exit_reason``: ``uncaught RuntimeError: ...``, ``terminated by SIGTERM``).
_ENDED = ("uncaught ", "terminated by ")

_NS = 1e9


def classify(
    job: JobStatuses,
    *,
    world_size: int | None = None,
    thresholds: Thresholds | None = None,
    now_ns: int | None = None,
) -> JobView:
    """Classify every rank of ``job`` as of ``now_ns`` (default: when it was fetched).

    ``world_size`` (the user's flag) is used when the job did not rendezvous in this store.
    """
    limits = thresholds or Thresholds()
    now = job.fetched_ns if now_ns is None else now_ns
    size, source = _world_size(job, world_size)
    stuck = _stuck_seqs(job.statuses.values(), now, limits.slow_s)
    members = _members(job.statuses.values())
    seen = job.ranks_seen
    views = [_missing(r) for r in range(size) if r not in seen]
    views += [RankView(rank, ERROR, ("bad_status",), error=why) for rank, why in job.bad.items()]
    views += [
        _rank_view(snap, now, limits, _behind(snap, stuck, members))
        for snap in job.statuses.values()
    ]
    views.sort(key=lambda v: (not v.wrong, v.rank))
    return JobView(job.job, job.address, job.fetched_ns, size, source, limits, views)


def _world_size(job: JobStatuses, flag: int | None) -> tuple[int, str]:
    if job.rdzv_world_size is not None:
        return job.rdzv_world_size, "rendezvous"
    if flag is not None:
        return flag, "flag"
    if job.statuses:
        return max(s.world_size for s in job.statuses.values()), "status"
    return max(job.ranks_seen, default=-1) + 1, "ranks"


def _missing(rank: int) -> RankView:
    return RankView(rank, MISSING, ("missing",), error="no status published")


def _age_s(now_ns: int, then_ns: int) -> float:
    """Seconds since ``then_ns``; never negative (hosts' clocks may disagree a little)."""
    return max(0.0, (now_ns - then_ns) / _NS)


def _is_collective(rec: CollectiveRecord) -> bool:
    return rec.peer is None  # point-to-point seqs are per pair, not per communicator


def _stuck_seqs(snaps: Iterable[RankSnapshot], now_ns: int, slow_s: float) -> dict[str, int]:
    """Per communicator, the highest seq some rank has been inside for longer than ``slow_s``."""
    stuck: dict[str, int] = {}
    for snap in snaps:
        for rec in snap.records or ([snap.inflight] if snap.inflight else []):
            if _is_collective(rec) and _age_s(now_ns, rec.start_ns) > slow_s:
                stuck[rec.comm] = max(stuck.get(rec.comm, 0), rec.seq)
    return stuck


def _members(snaps: Iterable[RankSnapshot]) -> dict[str, list[int]]:
    """Each communicator's member ranks, as the first rank reporting it lists them."""
    members: dict[str, list[int]] = {}
    for snap in snaps:
        for name, info in snap.comms.items():
            members.setdefault(name, info.ranks)
    return members


def _behind(
    snap: RankSnapshot, stuck: dict[str, int], members: dict[str, list[int]]
) -> dict[str, int]:
    """Communicators where peers wait in a seq this rank has not started (comm -> that seq)."""
    behind: dict[str, int] = {}
    for comm, seq in stuck.items():
        info = snap.comms.get(comm)
        if info is None and snap.rank not in members.get(comm, ()):
            continue
        if (info.last_started if info else 0) < seq:
            behind[comm] = seq
    return behind


def _rank_view(
    snap: RankSnapshot, now_ns: int, limits: Thresholds, behind: dict[str, int]
) -> RankView:
    ended = _ended_badly(snap)
    if ended:
        return _ended(snap, now_ns, ended)
    if snap.finished or snap.reason == _CLOSED:
        return _done(snap, now_ns)
    heartbeat_age = _age_s(now_ns, snap.time_ns)
    rec = snap.inflight
    rec_age = _age_s(now_ns, rec.start_ns) if rec else None
    counters = snap.counters
    errors, hangs = int(counters.get("errors", 0)), int(counters.get("hangs", 0))
    retries = int(counters.get("retries", 0))
    failed = rec is not None and (rec.state != STARTED or bool(rec.error))
    flags = [
        name
        for name, on in (
            ("stale", heartbeat_age > limits.stale_s),
            ("failed", failed),
            ("slow", rec_age is not None and rec_age > limits.slow_s),
            ("behind", bool(behind)),
            # a retry re-ran the call each failed attempt was: a job that rode through a
            # link fault does not look wrong for good
            ("errors", errors > retries),
            ("hangs", hangs > 0),
        )
        if on
    ]
    if heartbeat_age > limits.stale_s:
        state = STALE
    elif failed:
        state = ERROR
    elif rec is not None:
        state = WAITING if rec.waiting_on is not None else IN_COLLECTIVE
    else:
        state = OK
    return RankView(
        rank=snap.rank,
        state=state,
        flags=tuple(flags),
        host=snap.host,
        pid=snap.pid,
        heartbeat_age_s=heartbeat_age,
        inflight=rec,
        inflight_age_s=rec_age,
        comms=snap.comms,
        behind=behind,
        busbw_gbps={str(k): float(v) for k, v in counters.get("last_busbw_gbps", {}).items()},
        collectives=int(counters.get("collectives", 0)),
        errors=errors,
        retries=retries,
        resumes=_count(counters.get("link_resumes")),
        hangs=hangs,
        error=(rec.error or f"collective {rec.state}") if rec is not None and failed else "",
        metrics_url=snap.metrics_url,
        store_reconnects=_count(counters.get("store_reconnects")),
        store_gap_s=_seconds(counters.get("store_gap_s")),
    )


def _ended_badly(snap: RankSnapshot) -> str:
    """Why a rank that ended did not finish, in words ("" when it finished cleanly or runs
    on): its own exit reason, or a closed status that still shows a failure (an older
    writer's, or the runtime's after an error: its last status says "closed" even then)."""
    if snap.reason.startswith(_ENDED):
        return snap.reason
    if snap.finished or snap.reason != _CLOSED:
        return ""
    failed = [r for r in snap.records if r.state != STARTED and r.state != COMPLETED]
    if snap.revoke is not None:
        return f"closed after the job's failure: {snap.revoke.describe()}"
    if failed:
        rec = failed[-1]
        return f"closed after {rec.op} seq {rec.seq} {rec.state}: {rec.error or rec.state}"
    return ""


def _ended(snap: RankSnapshot, now_ns: int, why: str) -> RankView:
    """A rank that ended other than cleanly: an error, never stale or behind (it is gone)."""
    view = _done(snap, now_ns)
    return dataclasses.replace(view, state=ERROR, flags=("failed",), error=why)


def _done(snap: RankSnapshot, now_ns: int) -> RankView:
    """A rank that finished: never stale, behind or failed, whatever its status's age."""
    counters = snap.counters
    return RankView(
        rank=snap.rank,
        state=DONE,
        host=snap.host,
        pid=snap.pid,
        heartbeat_age_s=_age_s(now_ns, snap.time_ns),
        comms=snap.comms,
        collectives=_count(counters.get("collectives")),
        errors=_count(counters.get("errors")),
        retries=_count(counters.get("retries")),
        resumes=_count(counters.get("link_resumes")),
        hangs=_count(counters.get("hangs")),
        metrics_url=snap.metrics_url,
    )


def _count(value: object) -> int:
    """A counter from a status: older writers have none (0); never trusted to be valid."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return 0.0
    return float(min(value, 1e9))
