"""What a rank's telemetry reads of a communicator's links, in the job's ranks.

Every transport a job builds (the world's, a retry's renewed one, a shrunk communicator's)
registers the same three sources, read only when metrics or a status are built: bytes to
and from each peer, links to each peer made again after a reset, and link handshakes it
refused; and how it reaches each peer (shared memory or TCP), for the slowness signals. A
shrunk communicator numbers its peers 0..n-1; its counts are filed under the job's ranks,
as every other count is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cclctl.runtime.transport.base import LinkCounters, Transport
from cclctl.runtime.transport.tcp.links import Links
from cclctl.telemetry.hub import Telemetry


def watch(
    telemetry: Telemetry, transport: Transport, links: Links, members: Sequence[int] | None = None
) -> None:
    """Count ``transport``'s bytes (where it offers :class:`LinkCounters`; else it has no
    link series) and ``links``' resumes and refusals on ``telemetry`` (``members``: each
    peer's job rank; None: they are the same)."""
    if members is None:
        if isinstance(transport, LinkCounters):
            telemetry.add_link_source(transport.link_bytes)
        telemetry.add_resume_source(lambda: links.resumed)
    else:
        job = list(members)
        if isinstance(transport, LinkCounters):
            telemetry.add_link_source(_in_job_ranks(transport, job))
        telemetry.add_resume_source(lambda: by_job_rank(links.resumed, job))
    telemetry.add_auth_failure_source(lambda: links.auth_failures)
    near = local_peers(transport)
    ranks = list(members) if members is not None else list(range(len(links.resumed)))
    telemetry.add_vias({rank: "shm" if i in near else "tcp" for i, rank in enumerate(ranks)})


def _in_job_ranks(
    counters: LinkCounters, job: Sequence[int]
) -> Callable[[], tuple[list[int], list[int]]]:
    """``counters``' bytes per peer, filed under each peer's job rank."""

    def link_bytes() -> tuple[list[int], list[int]]:
        sent, received = counters.link_bytes()
        return by_job_rank(sent, job), by_job_rank(received, job)

    return link_bytes


def local_peers(transport: Transport) -> set[int]:
    """The peers ``transport`` reaches over shared memory (as it numbers them)."""
    shm = transport if getattr(transport, "name", "") == "shm" else getattr(transport, "shm", None)
    group = getattr(shm, "group", None)
    return set(group.ranks) if group is not None else set()


def by_job_rank(counts: Sequence[int], members: Sequence[int]) -> list[int]:
    """Per-peer ``counts`` of a communicator, indexed by the job's ranks instead (up to the
    highest member: telemetry reads per-peer lists of any length)."""
    out = [0] * (max(members, default=-1) + 1)
    for i, rank in enumerate(members):
        out[rank] = counts[i]
    return out
