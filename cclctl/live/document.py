"""``cclctl top --json``: the job view as a stable, versioned document for scripts.

Field names and state words are part of the contract: add fields freely, but rename or
remove one only with a new ``version``. ``diagnosis`` is the ``cclctl.diagnosis`` document
that ``cclctl diagnose hang --store`` prints for the same statuses (null when no rank has
published yet); each rank's ``highlight``, ``suspect`` and ``waits_on`` say how the table
shows it.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from cclctl.live.culprit import Culprits, display_order
from cclctl.live.rank_view import JobView, RankView

TOP_SCHEMA = "cclctl.top"
TOP_VERSION = 1


def to_document(view: JobView, culprits: Culprits) -> dict[str, Any]:
    """The whole view; ``ranks`` is in display order (suspects first, then other wrong
    ranks, the ranks waiting on suspects, and the rest, each group by rank).
    """
    return {
        "schema": TOP_SCHEMA,
        "version": TOP_VERSION,
        "job": view.job,
        "store": view.address,
        "time_ns": view.fetched_ns,
        "world_size": view.world_size,
        "world_size_source": view.world_size_source,
        "ranks_seen": view.seen,
        "wrong": sum(1 for r in view.ranks if culprits.looks_wrong(r)),
        "stale_after_s": view.thresholds.stale_s,
        "slow_after_s": view.thresholds.slow_s,
        "missing": view.missing,
        "diagnosis": None if culprits.diagnosis is None else culprits.diagnosis.to_dict(),
        "waiting": list(culprits.waiting_lines),
        "ranks": [rank_document(r, culprits) for r in display_order(view, culprits)],
    }


def dumps(doc: dict[str, Any]) -> str:
    """The document as ``top --json`` prints it: indented, each rank on a line of its own.
    (An indented dump of every rank's fields runs in Python, not in json's C encoder: 10 s
    at 100,000 ranks; a line per rank is encoded in C, and reads as well.)"""
    mark = f"\x00ranks {secrets.token_hex(8)}\x00"  # a string no field of the view holds
    head = json.dumps({**doc, "ranks": mark}, indent=2)
    rows = ",\n".join("    " + json.dumps(rank) for rank in doc["ranks"])
    return head.replace(json.dumps(mark), "[\n" + rows + "\n  ]" if rows else "[]", 1)


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def rank_document(rank: RankView, culprits: Culprits) -> dict[str, Any]:
    """One rank; ``current`` is its in-flight call (null when idle or unknown).

    ``highlight``: "suspect", "waiting" (on a suspect), "warn" (flags, no verdict) or "ok".
    ``suspect``: the verdict naming it (kind and reason in words) or null. ``waits_on``: the
    suspects it waits on by the diagnosis ([] when none), known even where ``current``
    names no peer (gloo, NCCL).
    """
    verdict = culprits.reasons.get(rank.rank)
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
        "link_resumes": rank.resumes,
        "hangs": rank.hangs,
        "store_reconnects": rank.store_reconnects,
        "store_gap_s": rank.store_gap_s,
        "error": rank.error or None,
        "metrics_url": rank.metrics_url,
        "highlight": culprits.highlight(rank),
        "suspect": None if verdict is None else {"kind": verdict[0], "reason": verdict[1]},
        "waits_on": list(culprits.waits_on.get(rank.rank, ())),
    }
