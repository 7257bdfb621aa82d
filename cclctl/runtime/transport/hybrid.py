"""Choosing the transport: shared memory within a host, TCP between hosts, both when mixed.

Every rank publishes, in one store round, the transport it was configured with
(``CCLCTL_TRANSPORT``), a key for its host and its TCP address. Ranks with the same host key
can map each other's segments: the key joins the hostname with the kernel's boot id and the
device of ``/dev/shm``, so two containers on one machine with separate ``/dev/shm`` mounts
are told apart, and a reused hostname on two machines is too. Every rank sees every answer,
so all of them reach the same choice: TCP as soon as one rank asks for it or one host cannot
share memory, shared memory when one host holds the whole job, and otherwise the hybrid
transport, whose all-reduce is hierarchical (see ``algorithms/hierarchical.py``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Transfer, Transport, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT, Capabilities
from cclctl.runtime.transport.shm.group import ShmGroup
from cclctl.runtime.transport.shm.layout import Layout
from cclctl.runtime.transport.shm.segment import host_key
from cclctl.runtime.transport.shm.transport import Exchange, ShmTransport, open_group
from cclctl.runtime.transport.tcp import TcpTransport
from cclctl.runtime.transport.tcp_links import Links

_MIXED_POLL_S = 0.001  # with both kinds pending: how long to poll sockets between shm looks


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Which ranks share a host, for collectives that work within hosts, then across."""

    group: ShmGroup | None  # this rank's host (None: alone on it)
    leaders: list[int]  # the lowest rank of every host, ascending
    leader: int  # this rank's host's leader


def build_transport(
    rank: int,
    world_size: int,
    job: str,
    exchange: Exchange,
    links: Links,
    *,
    choice: str = "auto",
    host: str = "",
    layout: Layout | None = None,
    spin_s: float | None = None,
    one_copy: bool = True,
) -> Transport:
    """Agree with every rank on a transport and open it (``links`` is handed over)."""
    tcp = TcpTransport(links)
    try:
        mine = {"transport": choice, "host": host or host_key(), "tcp": links.address}
        infos = [json.loads(raw) for raw in exchange("transport", json.dumps(mine).encode())]
        tcp.set_peers([str(info["tcp"]) for info in infos])
        keys = [str(info["host"]) for info in infos]
        if any(info["transport"] == "tcp" for info in infos) or len(set(keys)) == world_size:
            return tcp
        local = [r for r in range(world_size) if keys[r] == keys[rank]]
        group, every_host_ok = open_group(rank, local, job, exchange, layout=layout, spin_s=spin_s)
    except BaseException:
        tcp.close()
        raise
    if not every_host_ok:
        return tcp
    if group is not None and group.size == world_size:
        tcp.close()
        return ShmTransport(group, world_size, one_copy=one_copy)
    first = {key: min(r for r in range(world_size) if keys[r] == key) for key in keys}
    hierarchy = Hierarchy(group, sorted(set(first.values())), first[keys[rank]])
    shm = ShmTransport(group, world_size, one_copy=False) if group is not None else None
    return HybridTransport(shm, tcp, hierarchy if one_copy else None)


class HybridTransport:
    """Shared memory to the peers on this host, TCP to the rest, driven in one loop."""

    name = "hybrid"

    def __init__(
        self, shm: ShmTransport | None, tcp: TcpTransport, hierarchy: Hierarchy | None
    ) -> None:
        self.shm = shm
        self.tcp = tcp
        self.hierarchy = hierarchy
        self.capabilities = Capabilities(hierarchy=hierarchy) if hierarchy else POINT_TO_POINT
        self.rank = tcp.rank

    def _local(self, peer: int) -> bool:
        return self.shm is not None and self.shm.is_local(peer)

    def exchange(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:
        shm = self.shm
        if shm is None:
            self.tcp.exchange(call, step, sends, recvs, wait)
            return
        near = shm.start(
            call,
            step,
            [t for t in sends if shm.is_local(t[0])],
            [t for t in recvs if shm.is_local(t[0])],
        )
        far = self.tcp.start(
            call,
            step,
            [t for t in sends if not shm.is_local(t[0])],
            [t for t in recvs if not shm.is_local(t[0])],
            wait,
        )
        while near or far:
            moved = shm.advance(near, call) if near else False
            if far and self.tcp.advance(far, call):
                moved = True
            if moved or not (near or far):
                continue
            if not far:
                first = near[0]
                shm.group.block(
                    lambda: any(item.ready() for item in near), first.peer, first.what, call, wait
                )
            else:
                if near:
                    shm.group.check_peers(call, near[0].peer)
                self.tcp.block(far, call, wait, _MIXED_POLL_S if near else 0.5)

    def drop_link(self, peer: int) -> None:
        if self._local(peer) and self.shm is not None:
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

    def close(self) -> None:
        try:
            self.tcp.close()
        finally:
            if self.shm is not None:
                self.shm.close()
