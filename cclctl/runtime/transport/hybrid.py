"""Choosing the transport: shared memory within a host, TCP between hosts, both when mixed.

Every rank learns, through its :class:`~cclctl.runtime.transport.meeting.TransportMeeting`,
the transport each rank was configured with (``CCLCTL_TRANSPORT``), a key for each rank's
host and the TCP addresses of its peers. Ranks with the same host key can map each other's
segments: the key joins the hostname with the kernel's boot id and the device of
``/dev/shm``, so two containers on one machine with separate ``/dev/shm`` mounts are told
apart, and a reused hostname on two machines is too. Every rank learns the same facts, so
all of them reach the same choice: TCP as soon as one rank asks for it or one host cannot
share memory, shared memory when one host holds the whole job, and otherwise the hybrid
transport, whose all-reduce is hierarchical (see ``algorithms/hierarchical.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Protocol

from cclctl.revocation import Revocation
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import (
    LinkCounters,
    LinkCutter,
    PeerAnnouncer,
    Progress,
    SteppedTransport,
    Transfer,
    Transport,
    Wait,
)
from cclctl.runtime.transport.capabilities import POINT_TO_POINT, Capabilities
from cclctl.runtime.transport.drive import drive, exchanged
from cclctl.runtime.transport.meeting import Exchange, TransportMeeting, as_meeting
from cclctl.runtime.transport.shm.cross_memory import CrossMemory
from cclctl.runtime.transport.shm.group import ShmGroup
from cclctl.runtime.transport.shm.layout import Layout
from cclctl.runtime.transport.shm.segment import host_key
from cclctl.runtime.transport.shm.transport import ShmTransport, open_group
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.transport import TcpTransport


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Which ranks share a host, for collectives that work within hosts, then across."""

    group: ShmGroup | None  # this rank's host (None: alone on it)
    leaders: list[int]  # the lowest rank of every host, ascending
    leader: int  # this rank's host's leader
    cross_memory: CrossMemory | None = None  # the host's ranks reach each other's memory


def build_transport(
    rank: int,
    world_size: int,
    job: str,
    meeting: TransportMeeting | Exchange,
    links: Links,
    *,
    choice: str = "auto",
    host: str = "",
    layout: Layout | None = None,
    spin_s: float | None = None,
    one_copy: bool = True,
    cross_memory: str = "auto",
) -> Transport:
    """Agree with every rank on a transport and open it (``links`` is handed over).

    ``meeting``: how this rank learns the others' facts; an exchange meets in its rounds
    (:class:`~cclctl.runtime.transport.meeting.ExchangeMeeting`). ``cross_memory``: whether a
    host's ranks move plain buffers through each other's memory (``CCLCTL_SHM_CMA``:
    ``auto``, ``always``, ``never``)."""
    meet = as_meeting(meeting)
    tcp = TcpTransport(links)
    try:
        roster = meet.meet(choice, host or host_key(), links.address)
        tcp.set_peers(roster.addresses)
        keys = roster.keys
        if roster.tcp_asked or len(set(keys)) == world_size:
            return tcp
        local = [r for r in range(world_size) if keys[r] == keys[rank]]
        group, every_host_ok = open_group(
            rank, local, job, meet, layout=layout, spin_s=spin_s, cross_memory=cross_memory
        )
    except BaseException:
        tcp.close()
        raise
    if not every_host_ok:
        return tcp
    if group is not None and group.size == world_size:
        tcp.close()
        return ShmTransport(group, world_size, one_copy=one_copy)
    first = {key: min(r for r in range(world_size) if keys[r] == key) for key in keys}
    cross = group.cross_memory if group is not None else None
    hierarchy = Hierarchy(group, sorted(set(first.values())), first[keys[rank]], cross)
    shm = ShmTransport(group, world_size, one_copy=False) if group is not None else None
    near = group.ranks if group is not None else []
    return HybridTransport(shm, tcp, near, hierarchy if one_copy else None)


class Part(SteppedTransport, LinkCutter, LinkCounters, PeerAnnouncer, Protocol):
    """What the hybrid needs of each transport it joins: steps it can drive beside the
    other's, and the hooks it offers in turn (a cut link, the bytes, the announce)."""


class HybridTransport:
    """One transport to the peers on this host (shared memory), another to the rest (TCP),
    each step's shares of both driven in one loop, through :class:`Part` alone."""

    name = "hybrid"

    def __init__(
        self,
        shm: Part | None,
        tcp: Part,
        local: Collection[int],
        hierarchy: Hierarchy | None,
    ) -> None:
        """``local``: the ranks ``shm`` reaches (this rank's host); ``tcp`` reaches the rest."""
        self.shm = shm
        self.tcp = tcp
        self.hierarchy = hierarchy
        self._near = frozenset(local) if shm is not None else frozenset()
        self.capabilities = Capabilities(hierarchy=hierarchy) if hierarchy else POINT_TO_POINT

    def exchange(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:
        drive(self._shares(call, step, sends, recvs, wait), wait)
        exchanged(wait, recvs)

    def _shares(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> list[Progress]:
        """The step's shares: the local one first, the TCP one last (drive blocks on it)."""
        if self.shm is None:
            return [self.tcp.start(call, step, sends, recvs, wait)]
        near = self._near
        return [
            self.shm.start(
                call,
                step,
                [t for t in sends if t[0] in near],
                [t for t in recvs if t[0] in near],
                wait,
            ),
            self.tcp.start(
                call,
                step,
                [t for t in sends if t[0] not in near],
                [t for t in recvs if t[0] not in near],
                wait,
            ),
        ]

    def drop_link(self, peer: int) -> None:
        if self.shm is not None and peer in self._near:
            self.shm.drop_link(peer)
        else:
            self.tcp.drop_link(peer)

    def link_bytes(self) -> tuple[list[int], list[int]]:
        sent, received = self.tcp.link_bytes()
        if self.shm is not None:
            s2, r2 = self.shm.link_bytes()
            sent = [a + b for a, b in zip(sent, s2, strict=True)]
            received = [a + b for a, b in zip(received, r2, strict=True)]
        return sent, received

    def announce(self, status: str, revocation: Revocation | None) -> None:
        try:
            self.tcp.announce(status, revocation)
        finally:
            if self.shm is not None:
                self.shm.announce(status, revocation)

    def close(self) -> None:
        try:
            self.tcp.close()
        finally:
            if self.shm is not None:
                self.shm.close()
