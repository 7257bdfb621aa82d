"""Fetch every rank's status of one job from the store in a single round trip, and parse it.

A refresh must stay cheap with thousands of ranks, so it is one ``list()`` of the job's
namespace (``cclctl/<job>/``): statuses and the rendezvous' world size come back together.
A status that cannot be parsed is kept as that rank's problem instead of failing the view:
one broken rank must never hide the other 999.

A rank's status is under its own key (``status/<rank>``) or inside its host agent's
document (``host/<hostname>``, :mod:`cclctl.host_status`); where both hold one (a rank
whose agent was lost publishes its own), the newer one counts. A hang's diagnosis of a
large job reads its ranks alike once (``alike_from``), and then lists the agents' heads
and reads only a few documents whole (:mod:`cclctl.live.heads`) where the agents write
heads.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from cclctl import host_status, limits, probe_record
from cclctl.comm_info import clip
from cclctl.errors import BadInput, StoreError, UsageError
from cclctl.live import alike, heads, status_check
from cclctl.live.status_check import parse_one, unprefixed
from cclctl.probe_record import ProbeRecord
from cclctl.records import RankSnapshot

ROOT = "cclctl/"
STATUS_KEY = "status/"
WORLD_SIZE_KEY = "rdzv/world_size"  # written once by rendezvous: {"world_size": N, ...}

_STATUS_KEY_RE = re.compile(r"^cclctl/(?P<job>.+)/(status/[0-9]+|host/[^/]+)$")


class ListingStore(Protocol):
    """What reading a live job needs from a store (a StoreClient is one)."""

    @property
    def address(self) -> str: ...

    def list(self, prefix: str) -> dict[str, bytes]: ...

    def try_get(self, key: str) -> bytes | None: ...


@dataclasses.dataclass
class JobStatuses:
    """One job's statuses as fetched at ``fetched_ns`` (wall clock, like the heartbeats).

    ``bad`` maps a rank to why its status document could not be used.
    ``rdzv_world_size`` is None when the job did not rendezvous through this store.
    ``probe`` is the last probe a rank 0 published to the job's ``probe`` key.
    """

    job: str
    address: str
    fetched_ns: int
    statuses: dict[int, RankSnapshot] = dataclasses.field(default_factory=dict)
    bad: dict[int, str] = dataclasses.field(default_factory=dict)
    rdzv_world_size: int | None = None
    #: the job's last probe (:mod:`cclctl.probe_record`), and why it is unusable if it is
    probe: ProbeRecord | None = None
    probe_error: str = ""
    #: the host agents' documents by host (their statuses are in ``statuses``)
    hosts: dict[str, host_status.HostDocument] = dataclasses.field(default_factory=dict)
    #: a host document that could not be read, by host: why
    bad_hosts: dict[str, str] = dataclasses.field(default_factory=dict)
    #: ranks whose status came from their host agent's document (the others wrote their own)
    via_agent: set[int] = dataclasses.field(default_factory=set)

    @property
    def ranks_seen(self) -> set[int]:
        return set(self.statuses) | set(self.bad)


def job_prefix(job: str) -> str:
    return f"{ROOT}{job}/"


def jobs_in(keys: Mapping[str, Any]) -> list[str]:
    """The jobs that published at least one status among ``keys`` (full store keys: a rank's
    own, or its host agent's document), sorted."""
    jobs = {m["job"] for key in keys if (m := _STATUS_KEY_RE.match(key))}
    return sorted(jobs)


def fetch(
    store: ListingStore,
    job: str | None = None,
    *,
    alike_from: int | None = None,
    say: Callable[[str], None] | None = None,
) -> JobStatuses:
    """Read one job's statuses. Without ``job``, the store must hold exactly one job.
    ``alike_from``: see :func:`parse`. ``say``: told what is read once the listing is in
    (a progress line: a large job's parse takes seconds).

    Raises UsageError (exit 2) when no job, or more than one, has published status;
    StoreError when the store cannot be reached.
    """
    if job is not None:
        if alike_from is not None:
            through = _through_heads(store, job, alike_from, say)
            if through is not None:
                return through
        listing = store.list(job_prefix(job))
        _reading(listing, say)
        return parse(job, store.address, listing, alike_from=alike_from)
    listing = store.list(ROOT)
    jobs = jobs_in(listing)
    if not jobs:
        raise UsageError(f"no cclctl job has published status to {store.address} yet")
    if len(jobs) > 1:
        raise UsageError(
            f"{len(jobs)} jobs publish status to {store.address}: {', '.join(jobs)}; "
            "choose one with --job",
            jobs=jobs,
        )
    _reading(listing, say)
    return parse(jobs[0], store.address, listing, alike_from=alike_from)


def _through_heads(
    store: ListingStore, job: str, alike_from: int, say: Callable[[str], None] | None
) -> JobStatuses | None:
    """The job read through its host agents' heads (:mod:`cclctl.live.heads`), or None
    where it is to be listed whole."""
    prefix = job_prefix(job)
    head_listing = heads.listed(store, prefix)
    if not head_listing.docs or head_listing.ranks < alike_from:  # no heads, or a small job
        return None
    try:
        listing = store.list(prefix + STATUS_KEY)
        for key in (WORLD_SIZE_KEY, probe_record.KEY):
            value = store.try_get(prefix + key)
            if value is not None:
                listing[prefix + key] = value
        out, budget = _parsed_keys(job, store.address, listing)
        own = {**out.statuses, **out.bad}
        read = heads.read(store, prefix, head_listing, parse_one, own, out.rdzv_world_size)
    except StoreError:  # a store that lets this client list but not read a key: list whole
        return None
    if read is None:
        return None
    if say is not None:
        say(f"read the heads of {len(read.hosts) + len(read.bad_hosts):,} host documents "
            f"({read.head_bytes / 2**20:.1f} MiB) and {read.whole:,} documents whole "
            f"({read.whole_bytes / 2**20:.1f} MiB)")  # fmt: skip
    out.hosts, out.bad_hosts = read.hosts, read.bad_hosts
    _merge_found(out, budget, read.found)
    return out


def _reading(listing: Mapping[str, bytes], say: Callable[[str], None] | None) -> None:
    if say is not None:
        size = sum(map(len, listing.values()))
        say(f"reading {len(listing):,} keys of statuses ({size / 2**20:.1f} MiB)")


def parse(
    job: str, address: str, listing: Mapping[str, bytes], *, alike_from: int | None = None
) -> JobStatuses:
    """Parse a listing of full store keys; keys of other jobs are ignored.

    ``alike_from``: where the host documents hold at least this many statuses, ranks that
    are alike are parsed once (:mod:`cclctl.live.alike`: for a hang's diagnosis, which
    reads none of what such a rank's status lacks); None: every status in full.

    A status the view cannot use is that rank's problem, except one stating a size beyond
    :mod:`cclctl.limits` (a rank key, a world size): that raises TooLarge for the whole
    job, since every reader would allocate by it.
    """
    out, budget = _parsed_keys(job, address, listing)
    _merge_hosts(out, budget, alike_from)
    return out


def _parsed_keys(
    job: str, address: str, listing: Mapping[str, bytes]
) -> tuple[JobStatuses, limits.MemberBudget]:
    """:func:`parse` but for merging the host documents' statuses: the job's keys read."""
    out = JobStatuses(job=job, address=address, fetched_ns=time.time_ns())
    status_head = job_prefix(job) + STATUS_KEY
    world_size_key = job_prefix(job) + WORLD_SIZE_KEY
    probe_key = job_prefix(job) + probe_record.KEY
    host_head = job_prefix(job) + host_status.KEY
    budget = limits.MemberBudget("the statuses")
    for key, value in listing.items():
        if key.startswith(host_head):
            _host(out, key[len(host_head) :], value)
            continue
        if key == world_size_key:
            out.rdzv_world_size = _rendezvous_world_size(value)
            continue
        if key == probe_key:
            try:
                out.probe = probe_record.parse(value)
            except BadInput as exc:  # the probe's problem, never the statuses'
                out.probe_error = exc.message
            continue
        rank_text = key[len(status_head) :] if key.startswith(status_head) else ""
        if not (rank_text.isascii() and rank_text.isdigit()):
            continue
        # more digits than any limit has are refused before int() (which caps at 4,300)
        number = int(rank_text) if len(rank_text) <= 9 else 10**9
        rank = limits.rank(number, f"status key {clip(key, 60)}")
        try:
            out.statuses[rank] = snap = status_check.status(value, rank)
            budget.add(info.ranks for info in snap.comms.values())
        except limits.TooLarge as exc:
            raise limits.TooLarge(f"status of rank {rank}: {unprefixed(exc)}") from None
        except BadInput as exc:
            out.bad[rank] = f"bad status: {unprefixed(exc)}"
    return out, budget


def _merge_hosts(out: JobStatuses, budget: limits.MemberBudget, alike_from: int | None) -> None:
    """The statuses in the host documents, each where it is newer than the rank's own key's
    (``alike_from``: see :func:`parse`)."""
    hosts = out.hosts.values()
    use_alike = alike_from is not None and sum(len(d.statuses) for d in hosts) >= alike_from
    found = alike.host_statuses(hosts, parse_one) if use_alike else _every_status(hosts)
    _merge_found(out, budget, found)


def _merge_found(
    out: JobStatuses, budget: limits.MemberBudget, found: Iterable[alike.Found]
) -> None:
    """The statuses ``found`` in ``out.hosts``, each where it is newer than the rank's own
    key's."""
    for doc in out.hosts.values():  # a document's ranks are digits already: its largest is checked
        if doc.ranks:
            limits.rank(max(doc.ranks), f"host document of {doc.host!r}")
    counted: object = None  # the communicators last counted (alike ranks share their model's)
    for rank, doc, read in found:
        if isinstance(read, BadInput):
            if rank not in out.statuses:
                out.bad[rank] = f"bad status (from {doc.host}'s agent): {unprefixed(read)}"
            continue
        mine = out.statuses.get(rank)
        if mine is None or read.time_ns > mine.time_ns:
            out.statuses[rank] = read
            out.bad.pop(rank, None)
            out.via_agent.add(rank)
            if read.comms is not counted:
                budget.add(info.ranks for info in read.comms.values())
                counted = read.comms


def _every_status(hosts: Iterable[host_status.HostDocument]) -> Iterator[alike.Found]:
    """Every status ``hosts`` hold, each parsed in full."""
    for doc in hosts:
        for rank, text in doc.statuses.items():
            yield rank, doc, parse_one(text, rank, keyed=False)[0]


def _host(out: JobStatuses, host: str, value: bytes) -> None:
    """Keep a host agent's document (its statuses are merged once every key was read)."""
    try:
        out.hosts[host] = host_status.parse(value, host_status.document_name(host))
    except BadInput as exc:
        out.bad_hosts[host] = exc.message


def _rendezvous_world_size(value: bytes) -> int | None:
    """The agreed world size, or None if the key holds something else; TooLarge beyond
    :data:`cclctl.limits.MAX_WORLD_SIZE`."""
    try:
        size = json.loads(value).get("world_size")
    except (ValueError, AttributeError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    return limits.world_size(size, "the store's rendezvous")
