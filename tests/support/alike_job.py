"""A job of ``n`` ranks in flight as host agents leave it in the store, for the tests of
reading alike ranks once (``test_alike.py``) and of reading through the agents' heads
(``test_heads.py``): one document (and its head) per host of :data:`PER_HOST` ranks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cclctl import host_status
from cclctl.records import COMPLETED, CollectiveRecord, CommInfo, RankSnapshot

NS = 1_000_000_000
NOW = 1_800_000_000 * NS
SEQ = 40
JOB = "j"
PER_HOST = 4


def in_flight(comm: str, seq: int, rank: int, n: int, op: str, now: int) -> CollectiveRecord:
    return CollectiveRecord(comm, seq, op, "float32", 256, 1024, algo="ring",
                            start_ns=now - 30 * NS - rank * 1000, step=rank % 3,
                            waiting_on=(rank - 1) % n, waiting_for="recv")  # fmt: skip


def rank_status(
    rank: int, n: int, *, seq: int = SEQ, op: str = "all_reduce", now: int = NOW, **kw: Any
) -> RankSnapshot:
    """Rank ``rank`` of ``n`` in flight at ``seq`` of the world (``seq`` 0: it never
    entered ``SEQ``, having completed the one before), its status written about ``now``."""
    world = f"0:0-{n - 1}"
    done = CollectiveRecord(world, SEQ - 1, "all_reduce", "float32", 256, 1024, algo="ring",
                            state=COMPLETED, start_ns=now - 31 * NS + rank,
                            end_ns=now - 30 * NS)  # fmt: skip
    call = in_flight(world, seq, rank, n, op, now) if seq else None
    started = seq if seq else SEQ - 1
    fields: dict[str, Any] = dict(
        kind="status", job=JOB, rank=rank, world_size=n, host=host_of(rank), pid=1000 + rank,
        time_ns=now - 1000 * rank, comms={world: CommInfo(list(range(n)), started, SEQ - 1)},
        records=[done] + ([call] if call else []), inflight=call,
        counters={"collectives": SEQ - 1, "errors": 0, "retries": 0, "hangs": 0,
                  "last_busbw_gbps": {"all_reduce": 1.0 + rank / 7}},
    )  # fmt: skip
    fields.update(kw)
    return RankSnapshot(**fields)


def host_of(rank: int) -> str:
    return f"h{rank // PER_HOST}"


def job_listing(
    snaps: dict[int, RankSnapshot], texts: dict[int, str] | None = None, now: int = NOW
) -> dict[str, bytes]:
    """The store as the ranks' agents leave it: one document and its head per host,
    summarized from the statuses as decoded (``texts``: what a rank's agent holds instead,
    after summarizing)."""
    by_host: dict[str, dict[int, str]] = {}
    for rank, snap in sorted(snaps.items()):
        by_host.setdefault(snap.host, {})[rank] = snap.to_json()
    out = {f"cclctl/{JOB}/rdzv/world_size": json.dumps({"world_size": len(snaps)}).encode()}
    for host, statuses in by_host.items():
        summary = host_status.summarize({r: json.loads(t) for r, t in statuses.items()}, statuses)
        for rank in statuses:
            statuses[rank] = (texts or {}).get(rank, statuses[rank])
        doc = host_status.HostDocument(host, 7, now, 1.0, statuses, summary=summary)
        out[f"cclctl/{JOB}/host/{host}"] = doc.to_bytes()
        out[f"cclctl/{JOB}/head/{host}"] = doc.head_bytes()
    return out


def job_statuses(n: int, now: int = NOW, **odd: dict[str, Any]) -> dict[int, RankSnapshot]:
    """Every rank's status; ``odd``: a rank's own changes (by its rank as text)."""
    return {r: rank_status(r, n, now=now, **odd.get(str(r), {})) for r in range(n)}


def rewrite_host(
    listing: dict[str, bytes], host: str, change: Callable[[int, dict[str, Any]], Any]
) -> host_status.HostDocument:
    """``host``'s statuses in ``listing`` changed (``change(rank, status)``: its new status,
    or a text), its summary and head made again from them, as its agent makes them; the
    document written back is returned."""
    key = f"cclctl/{JOB}/{host_status.KEY}{host}"
    doc = host_status.parse(listing[key], host)
    decoded = {}
    for rank, text in doc.statuses.items():
        new = change(rank, json.loads(text))
        doc.statuses[rank] = new if isinstance(new, str) else json.dumps(new)
        decoded[rank] = new if isinstance(new, dict) else None
    doc.summary = host_status.summarize(decoded, doc.statuses)
    listing[key] = doc.to_bytes()
    listing[f"cclctl/{JOB}/{host_status.HEAD_KEY}{host}"] = doc.head_bytes()
    return doc
