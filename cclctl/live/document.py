"""``cclctl top --json``: the job view as a stable, versioned document for scripts.

Field names and state words are part of the contract: add fields freely, but rename or
remove one only with a new ``version``.
"""

from __future__ import annotations

from typing import Any

from cclctl.live.classify import JobView, RankView

TOP_SCHEMA = "cclctl.top"
TOP_VERSION = 1


def to_document(view: JobView) -> dict[str, Any]:
    """The whole view; ``ranks`` is in display order (wrong ranks first, then by rank)."""
    return {
        "schema": TOP_SCHEMA,
        "version": TOP_VERSION,
        "job": view.job,
        "store": view.address,
        "time_ns": view.fetched_ns,
        "world_size": view.world_size,
        "world_size_source": view.world_size_source,
        "ranks_seen": view.seen,
        "wrong": view.wrong,
        "stale_after_s": view.thresholds.stale_s,
        "slow_after_s": view.thresholds.slow_s,
        "missing": view.missing,
        "ranks": [rank_document(r) for r in view.ranks],
    }


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def rank_document(rank: RankView) -> dict[str, Any]:
    """One rank; ``current`` is its in-flight call (null when idle or unknown)."""
    rec = rank.inflight
    current = None
    if rec is not None:
        current = {
            "comm": rec.comm,
            "seq": rec.seq,
            "op": rec.op,
            "nbytes": rec.nbytes,
            "dtype": rec.dtype,
            "peer": rec.peer,
            "state": rec.state,
            "age_s": _seconds(rank.inflight_age_s),
            "step": rec.step,
            "steps": rec.steps,
            "waiting_on": rec.waiting_on,
            "waiting_for": rec.waiting_for,
        }
    return {
        "rank": rank.rank,
        "state": rank.state,
        "wrong": rank.wrong,
        "flags": list(rank.flags),
        "host": rank.host,
        "pid": rank.pid,
        "heartbeat_age_s": _seconds(rank.heartbeat_age_s),
        "current": current,
        "comms": {
            name: {"last_started": info.last_started, "last_completed": info.last_completed}
            for name, info in rank.comms.items()
        },
        "behind": dict(rank.behind),
        "last_busbw_gbps": dict(rank.busbw_gbps),
        "collectives": rank.collectives,
        "errors": rank.errors,
        "retries": rank.retries,
        "hangs": rank.hangs,
        "error": rank.error or None,
        "metrics_url": rank.metrics_url,
    }
