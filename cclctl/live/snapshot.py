"""Fetch every rank's status of one job from the store in a single round trip, and parse it.

A refresh must stay cheap with thousands of ranks, so it is one ``list()`` of the job's
namespace (``cclctl/<job>/``): statuses and the rendezvous' world size come back together.
A status that cannot be parsed is kept as that rank's problem instead of failing the view:
one broken rank must never hide the other 999.

A rank's status is under its own key (``status/<rank>``) or inside its host agent's
document (``host/<hostname>``, :mod:`cclctl.host_status`); where both hold one (a rank
whose agent was lost publishes its own), the newer one counts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from cclctl import host_status, limits, probe_record
from cclctl.errors import BadInput, UsageError
from cclctl.live import alike
from cclctl.probe_record import ProbeRecord
from cclctl.records import RankSnapshot, snapshot_from_dict
from cclctl.status_digest import digest

ROOT = "cclctl/"
STATUS_KEY = "status/"
WORLD_SIZE_KEY = "rdzv/world_size"  # written once by rendezvous: {"world_size": N, ...}

_WHERE = "status"
_STATUS_KEY_RE = re.compile(r"^cclctl/(?P<job>.+)/(status/[0-9]+|host/[^/]+)$")


class ListingStore(Protocol):
    """What reading a live job needs from a store (a StoreClient is one)."""

    @property
    def address(self) -> str: ...

    def list(self, prefix: str) -> dict[str, bytes]: ...


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
        rank = limits.rank(number, f"status key {_clip(key)}")
        try:
            out.statuses[rank] = snap = _status(value, rank)
            budget.add(info.ranks for info in snap.comms.values())
        except limits.TooLarge as exc:
            raise limits.TooLarge(f"status of rank {rank}: {_unprefixed(exc)}") from None
        except BadInput as exc:
            out.bad[rank] = f"bad status: {_unprefixed(exc)}"
    _merge_hosts(out, budget, alike_from)
    return out


def _merge_hosts(out: JobStatuses, budget: limits.MemberBudget, alike_from: int | None) -> None:
    """The statuses in the host documents, each where it is newer than the rank's own key's
    (``alike_from``: see :func:`parse`)."""
    hosts = out.hosts.values()
    for doc in hosts:  # a document's ranks are digits already: its largest is checked
        if doc.statuses:
            limits.rank(max(doc.statuses), f"host document of {doc.host!r}")
    use_alike = alike_from is not None and sum(len(d.statuses) for d in hosts) >= alike_from
    found = alike.host_statuses(hosts, _parse_one) if use_alike else _every_status(hosts)
    counted: object = None  # the communicators last counted (alike ranks share their model's)
    for rank, doc, read in found:
        if isinstance(read, BadInput):
            if rank not in out.statuses:
                out.bad[rank] = f"bad status (from {doc.host}'s agent): {_unprefixed(read)}"
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
            yield rank, doc, _parse_one(text, rank, keyed=False)[0]


def _parse_one(
    text: str, rank: int, keyed: bool = True
) -> tuple[RankSnapshot | BadInput, str | None]:
    """Rank ``rank``'s status from a host document, or why it is unusable; and, where
    ``keyed``, its digest's key (:mod:`cclctl.status_digest`; None: it has none). A size
    beyond :mod:`cclctl.limits` raises TooLarge, for the whole job."""
    try:
        data = _decoded(text)  # a host document's status is text already
        snap = _checked(data, rank)
    except limits.TooLarge as exc:
        raise limits.TooLarge(f"status of rank {rank}: {_unprefixed(exc)}") from None
    except BadInput as exc:
        return exc, None
    row = digest(data) if keyed else None
    return snap, None if row is None else row[2]  # the key (its text's hash is not needed)


def _host(out: JobStatuses, host: str, value: bytes) -> None:
    """Keep a host agent's document (its statuses are merged once every key was read)."""
    try:
        out.hosts[host] = host_status.parse(value, f"host document {_clip(host)!r}")
    except BadInput as exc:
        out.bad_hosts[host] = exc.message


def _unprefixed(exc: BadInput) -> str:
    return exc.message.removeprefix(_WHERE + ": ")


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _status(value: bytes, rank: int) -> RankSnapshot:
    """A rank's status, checked beyond the schema: the fields a view reads must be usable."""
    return _checked(_decoded(value), rank)


def _decoded(value: str | bytes) -> Any:
    where = _WHERE
    try:
        return json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{where}: not valid JSON ({exc})", where=where) from None
    except RecursionError:
        raise BadInput(f"{where}: JSON nested too deeply", where=where) from None


def _checked(data: Any, rank: int) -> RankSnapshot:
    """A rank's status from its decoded document (its own key's, or its host agent's)."""
    where = _WHERE
    if not isinstance(data, dict):
        raise BadInput(f"{where}: not a JSON object", where=where)
    snap = snapshot_from_dict(data, where)
    if snap.rank != rank:
        raise BadInput(f"{where}: the document says it is rank {snap.rank}", where=where)
    if snap.kind != "status":
        raise BadInput(f"{where}: a {snap.schema} document, not a status", where=where)
    for name in ("collectives", "errors", "retries", "hangs"):
        count = snap.counters.get(name, 0)
        if not isinstance(count, int) or isinstance(count, bool):
            raise BadInput(f"{where}: counter {name!r} is not an integer", where=where)
    busbw = snap.counters.get("last_busbw_gbps", {})
    if not isinstance(busbw, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in busbw.values()
    ):
        raise BadInput(f"{where}: 'last_busbw_gbps' is not a map of numbers", where=where)
    return snap


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
