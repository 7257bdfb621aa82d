"""The world document a fan-in rendezvous ends with: every host, its ranks and their pids,
and what the transport's choice needs of them.

One JSON object, folded so its size grows with the hosts, not the ranks::

    {"world_size": 16, "hosts": [{"host": "a", "ranks": "0-7", "pids": "4100+8"}, ...],
     "tcp": "3"}

``ranks`` is folded (:func:`cclctl.ranges.fold_ranks`); ``pids`` lists the pids of those
ranks in rank order as runs of consecutive pids (``"4100+8,4300"``: 4100 to 4107, then
4300), since a launcher usually starts a host's ranks one after another. A rank's runtime
reads from it what the flat rendezvous gave it: the host and the pid of every rank.

Each claim also carries its rank's host key (:func:`~cclctl.runtime.transport.shm.segment.
host_key`: the kernel, the ``/dev/shm`` mount and the pid namespace) and whether it asked
for TCP. The ranks of a host name normally share one key, and its entry does not repeat
it; a host name whose ranks carry several keys (containers with one hostname, a hostname
reused on two machines) is split into one entry per key, each with its ``"key"``. ``tcp``,
present only when some rank asked for TCP, folds those ranks. So the ranks that share an
entry are exactly those that can map each other's segments (:attr:`World.keys`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cclctl.errors import RendezvousError, UsageError
from cclctl.ranges import fold_ranks, parse_ranks


def fold_pids(pids: Sequence[int]) -> str:
    """``[4100, 4101, 4102, 300]`` -> ``"4100+3,300"`` (order kept)."""
    parts: list[str] = []
    i = 0
    while i < len(pids):
        j = i
        while j + 1 < len(pids) and pids[j + 1] == pids[j] + 1:
            j += 1
        count = j - i + 1
        parts.append(str(pids[i]) if count == 1 else f"{pids[i]}+{count}")
        i = j + 1
    return ",".join(parts)


def unfold_pids(text: str, limit: int) -> list[int]:
    """The inverse of :func:`fold_pids`, at most ``limit`` pids (a ValueError past it)."""
    pids: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, count = part.partition("+")
        start, n = int(first), int(count) if count else 1
        if n < 1 or len(pids) + n > limit:
            raise ValueError(f"{part!r} names more pids than ranks")
        pids.extend(range(start, start + n))
    return pids


def build(
    world_size: int,
    claims: Iterable[tuple[int, str, int]],
    keys: Mapping[int, str] | None = None,
    tcp: Iterable[int] = (),
) -> bytes:
    """The document of ``claims`` (rank, host, pid), one per rank of the world; ``keys``:
    each rank's host key (missing: ""); ``tcp``: the ranks that asked for TCP."""
    keys = keys or {}
    by_host: dict[str, list[tuple[int, int]]] = {}
    for rank, host, pid in claims:
        by_host.setdefault(host, []).append((rank, pid))
    entries: list[tuple[str, str | None, list[tuple[int, int]]]] = []
    for host, members in by_host.items():
        by_key: dict[str, list[tuple[int, int]]] = {}
        for rank, pid in members:
            by_key.setdefault(keys.get(rank, ""), []).append((rank, pid))
        if len(by_key) == 1:
            entries.append((host, None, members))
        else:
            entries.extend((host, key, part) for key, part in by_key.items())
    hosts = []
    for host, key, members in sorted(entries, key=lambda entry: min(entry[2])):
        members.sort()
        ranks = [rank for rank, _ in members]
        entry = {"host": host} if key is None else {"host": host, "key": key}
        entry.update(ranks=fold_ranks(ranks), pids=fold_pids([pid for _, pid in members]))
        hosts.append(entry)
    doc: dict[str, Any] = {"world_size": world_size, "hosts": hosts}
    asked = sorted(set(tcp))
    if asked:
        doc["tcp"] = fold_ranks(asked)
    return json.dumps(doc, separators=(",", ":")).encode()


def host_members(raw: bytes, host: str, world_size: int) -> dict[int, int]:
    """The pid of each rank the document places on ``host``: what an agent checks its own
    claims against. It finds the host's entries as :func:`build` wrote them (one per host,
    or one per key of a split host) and decodes those alone, not the whole world; a
    RendezvousError if unreadable."""
    members: dict[int, int] = {}
    text = raw.decode()
    pattern = '{"host":' + json.dumps(host) + ","
    decoder = json.JSONDecoder()
    try:
        start = text.find(pattern)
        while start >= 0:
            entry, end = decoder.raw_decode(text, start)
            ranks = parse_ranks(str(entry["ranks"]), limit=world_size)
            members.update(zip(ranks, unfold_pids(str(entry["pids"]), len(ranks)), strict=True))
            start = text.find(pattern, end)
    except (ValueError, TypeError, KeyError, UsageError) as exc:
        raise RendezvousError(f"the rendezvous' world document is unreadable: {exc}") from None
    return members


@dataclasses.dataclass(frozen=True)
class World:
    """What a rank reads of the document: by rank, each rank's host, pid and host key (equal
    for ranks that can map each other's segments), and the ranks that asked for TCP."""

    hosts: list[str]
    pids: list[int]
    keys: list[str]
    tcp: list[int]


def expand(raw: bytes, world_size: int) -> tuple[list[str], list[int]]:
    """The host and the pid of every rank, by rank (see :func:`read`)."""
    world = read(raw, world_size)
    return world.hosts, world.pids


def read(raw: bytes, world_size: int) -> World:
    """The whole document, by rank; a RendezvousError if it is not one of this world
    (another size, a rank twice or none)."""
    try:
        doc: Any = json.loads(raw)
        if doc.get("world_size") != world_size:
            raise ValueError(f"it is of world size {doc.get('world_size')!r}")
        hosts: list[str | None] = [None] * world_size
        pids = [0] * world_size
        keys = [""] * world_size
        for entry in doc["hosts"]:
            ranks = parse_ranks(str(entry["ranks"]), limit=world_size)
            their = unfold_pids(str(entry["pids"]), len(ranks))
            if len(their) != len(ranks):
                raise ValueError(f"host {entry['host']!r} has {len(ranks)} ranks, not pids")
            host, key = str(entry["host"]), entry.get("key")
            if key is not None and not isinstance(key, str):
                raise ValueError(f"host {host!r} has a key that is no string")
            # a split host's entries differ by key; a NUL is in no hostname
            ident = host if key is None else f"{host}\0{key}"
            for rank, pid in zip(ranks, their, strict=True):
                if hosts[rank] is not None:
                    raise ValueError(f"rank {rank} is on two hosts")
                hosts[rank], pids[rank], keys[rank] = host, pid, ident
        tcp = parse_ranks(str(doc["tcp"]), limit=world_size) if "tcp" in doc else []
    except (ValueError, TypeError, KeyError, AttributeError, UsageError) as exc:
        raise RendezvousError(f"the rendezvous' world document is unreadable: {exc}") from None
    absent = [r for r, host in enumerate(hosts) if host is None]
    if absent:
        raise RendezvousError(f"the rendezvous' world document lacks ranks {fold_ranks(absent)}")
    return World([str(host) for host in hosts], pids, keys, tcp)
