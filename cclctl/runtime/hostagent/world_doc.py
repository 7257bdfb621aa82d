"""The world document a fan-in rendezvous ends with: every host, its ranks and their pids.

One JSON object, folded so its size grows with the hosts, not the ranks::

    {"world_size": 16, "hosts": [{"host": "a", "ranks": "0-7", "pids": "4100+8"}, ...]}

``ranks`` is folded (:func:`cclctl.ranges.fold_ranks`); ``pids`` lists the pids of those
ranks in rank order as runs of consecutive pids (``"4100+8,4300"``: 4100 to 4107, then
4300), since a launcher usually starts a host's ranks one after another. A rank's runtime
reads from it what the flat rendezvous gave it: the host and the pid of every rank.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
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


def build(world_size: int, claims: Iterable[tuple[int, str, int]]) -> bytes:
    """The document of ``claims`` (rank, host, pid), one per rank of the world."""
    by_host: dict[str, list[tuple[int, int]]] = {}
    for rank, host, pid in claims:
        by_host.setdefault(host, []).append((rank, pid))
    hosts = []
    for host, members in sorted(by_host.items(), key=lambda item: min(item[1])):
        members.sort()
        ranks = [rank for rank, _ in members]
        hosts.append({"host": host, "ranks": fold_ranks(ranks),
                      "pids": fold_pids([pid for _, pid in members])})  # fmt: skip
    return json.dumps({"world_size": world_size, "hosts": hosts}, separators=(",", ":")).encode()


def host_members(raw: bytes, host: str, world_size: int) -> dict[int, int]:
    """The pid of each rank the document places on ``host``: what an agent checks its own
    claims against. It finds the host's entry as :func:`build` wrote it (one per host) and
    decodes that alone, not the whole world; a RendezvousError if unreadable."""
    members: dict[int, int] = {}
    text = raw.decode()
    start = text.find('{"host":' + json.dumps(host) + ",")
    try:
        entries = [json.JSONDecoder().raw_decode(text, start)[0]] if start >= 0 else []
        for entry in entries:
            ranks = parse_ranks(str(entry["ranks"]), limit=world_size)
            members.update(zip(ranks, unfold_pids(str(entry["pids"]), len(ranks)), strict=True))
    except (ValueError, TypeError, KeyError, UsageError) as exc:
        raise RendezvousError(f"the rendezvous' world document is unreadable: {exc}") from None
    return members


def expand(raw: bytes, world_size: int) -> tuple[list[str], list[int]]:
    """The host and the pid of every rank, by rank; a RendezvousError if the document is
    not one of this world (another size, a rank twice or none)."""
    try:
        doc: Any = json.loads(raw)
        if doc.get("world_size") != world_size:
            raise ValueError(f"it is of world size {doc.get('world_size')!r}")
        hosts: list[str | None] = [None] * world_size
        pids = [0] * world_size
        for entry in doc["hosts"]:
            ranks = parse_ranks(str(entry["ranks"]), limit=world_size)
            their = unfold_pids(str(entry["pids"]), len(ranks))
            if len(their) != len(ranks):
                raise ValueError(f"host {entry['host']!r} has {len(ranks)} ranks, not pids")
            for rank, pid in zip(ranks, their, strict=True):
                if hosts[rank] is not None:
                    raise ValueError(f"rank {rank} is on two hosts")
                hosts[rank], pids[rank] = str(entry["host"]), pid
    except (ValueError, TypeError, KeyError, AttributeError, UsageError) as exc:
        raise RendezvousError(f"the rendezvous' world document is unreadable: {exc}") from None
    absent = [r for r, host in enumerate(hosts) if host is None]
    if absent:
        raise RendezvousError(f"the rendezvous' world document lacks ranks {fold_ranks(absent)}")
    return [str(host) for host in hosts], pids
