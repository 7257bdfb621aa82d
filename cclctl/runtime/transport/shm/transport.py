"""The shared-memory transport for ranks on one host.

Two paths share each rank's segment:

- **Point-to-point** (:meth:`ShmTransport.exchange`, the Transport interface): every
  algorithm runs unchanged, over a ring of slots per pair of ranks (``p2p.py``).
- **One-copy collectives** (:attr:`ShmTransport.capabilities`, ``algorithms/shared.py``):
  a rank copies its input into its own segment once, and every peer reduces or copies
  straight out of it with numpy's ``out=``: no extra copies, no messages (``group.py``).

Setup goes through the transport's meeting (:mod:`cclctl.runtime.transport.meeting`): each
rank creates its segment and publishes its name to its host's ranks, the peers map it, and
once every rank of the job has said whether it mapped all of its host's, each owner unlinks
its name, so nothing is left in ``/dev/shm`` however a rank later dies.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from cclctl.errors import CclError, PeerError
from cclctl.revocation import Revocation
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Transfer, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT, Capabilities
from cclctl.runtime.transport.drive import DrivenAlone
from cclctl.runtime.transport.meeting import SegmentMeeting
from cclctl.runtime.transport.shm import cross_memory as cross
from cclctl.runtime.transport.shm import segment as shm_segment
from cclctl.runtime.transport.shm.futex import Futex
from cclctl.runtime.transport.shm.group import ShmGroup
from cclctl.runtime.transport.shm.layout import W_PID, Layout, View
from cclctl.runtime.transport.shm.p2p import Incoming, Outgoing, Rings, ShmStep

DEFAULT_SPIN_S = 50e-6  # busy polling before yielding the core
YIELD_S = 1e-3  # then yielding it (to a peer that may be waiting for it) before sleeping


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def open_group(
    rank: int,
    local_ranks: Sequence[int],
    job: str,
    meeting: SegmentMeeting,
    *,
    layout: Layout | None = None,
    spin_s: float | None = None,
    cross_memory: str = "auto",
) -> tuple[ShmGroup | None, bool]:
    """Map the segments of ``local_ranks`` (with ``rank``); every rank of the job calls this
    together. Returns this rank's group (None when it is alone on its host) and whether every
    host succeeded: when any rank could not map a peer's segment, every rank learns it, so
    the whole job can fall back to TCP in agreement. ``cross_memory``: whether the group
    reads and writes its peers' memory where the kernel lets every rank of the host do so
    (``cross_memory.py``): ``auto`` where the ranks do not outnumber the cores (more
    ranks than cores made it slower than the slots), ``always`` or ``never``.
    """
    ranks = sorted(local_ranks)
    alone = len(ranks) < 2 or not shm_segment.available()
    oversubscribed = len(ranks) > usable_cpus()
    # Ranks that outnumber the cores pay a context switch per synchronisation: give them
    # bigger rounds (fewer synchronisations) and no busy spin.
    layout = layout or Layout(len(ranks), slot_bytes=(4 if oversubscribed else 1) << 20)
    own: shm_segment.Segment | None = None
    views: list[View] = []
    try:
        if not alone:
            shm_segment.sweep()
            own = shm_segment.Segment.create(shm_segment.segment_name(job, rank), layout.size)
            mine = View(own, layout, rank)
            mine.init_owner()
            cross.offer(mine)
        names = meeting.segments(ranks, own.name.encode() if own else b"")
        problem = "" if own is not None or len(ranks) < 2 else "no writable /dev/shm"
        if own is not None:
            problem = _map_all(own, [names[r].decode() for r in ranks], layout, ranks, rank, views)
        if not problem and own is not None:
            me = views[ranks.index(rank)]
            wanted = cross_memory == "always" or (cross_memory == "auto" and not oversubscribed)
            cross.probe(me, [v for v in views if v is not me], wanted)
        every_host_ok = meeting.mapped(problem)
        if own is not None:
            own.unlink()  # every local rank has mapped it, or given up
        if own is None or not every_host_ok:
            _release(own, views)
            return None, every_host_ok
    except BaseException:
        _release(own, views)
        raise
    if spin_s is None:
        spin_s = 0.0 if oversubscribed else DEFAULT_SPIN_S
    group = ShmGroup(rank, ranks, views, layout, spin_s=spin_s, yield_s=YIELD_S, futex=Futex())
    group.cross_memory = cross.agreed(rank, views)  # every rank has probed: all have met
    return group, True


def _release(own: shm_segment.Segment | None, views: Sequence[View]) -> None:
    """Unmap what this rank mapped, its own segment last (its name is unlinked already or
    was never shared)."""
    for view in views:
        with contextlib.suppress(Exception):
            view.release()
    if own is not None:
        own.close()


def _map_all(
    own: shm_segment.Segment,
    names: Sequence[str],
    layout: Layout,
    ranks: Sequence[int],
    me: int,
    views: list[View],
) -> str:
    """Map every rank's segment into ``views``, in ``ranks``' order; what went wrong, or ""."""
    try:
        for name, r in zip(names, ranks, strict=True):
            views.append(_map(own, name, layout, r, me))
    except CclError as exc:
        return str(exc) or "cannot map"
    return ""


def _map(own: shm_segment.Segment, name: str, layout: Layout, rank: int, me: int) -> View:
    if rank == me:
        return View(own, layout, rank)
    if not name:
        raise CclError(f"rank {rank} published no shared-memory segment")
    view = View(shm_segment.Segment.attach(name), layout, rank)
    if not view.valid() or view.segment.mm.size() != layout.size:
        view.release()
        raise CclError(f"rank {rank}'s segment {name} is not a cclctl segment of this job")
    pid = view.i[W_PID]
    if pid != os.getpid():
        with contextlib.suppress(OSError, AttributeError):
            view.pidfd = os.pidfd_open(pid)
    return view


class ShmTransport(DrivenAlone):
    """Transport over one host's shared segments (every rank of the job on this host)."""

    name = "shm"

    def __init__(self, group: ShmGroup, world_size: int, one_copy: bool = True) -> None:
        """``one_copy=False`` leaves every collective to the point-to-point path (tests)."""
        self.group = group
        self.rank = group.rank
        self.world_size = world_size
        spans = one_copy and group.size == world_size
        #: the one-copy engine, when every rank of the communicator is on this host and no
        #: link was dropped (then every step goes through :meth:`start`, which reports it)
        self.capabilities = (
            Capabilities(one_copy=group, cross_memory=group.cross_memory)
            if spans
            else POINT_TO_POINT
        )
        self._local = {r: i for i, r in enumerate(group.ranks)}
        self._rings = Rings(group)
        self._sent = group.sent = [0] * world_size
        self._received = group.received = [0] * world_size
        self._dropped: set[int] = set()
        self._closed = False

    def is_local(self, peer: int) -> bool:
        return peer in self._local

    def start(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> ShmStep:
        """The transfers of one step, not yet moved."""
        if self._dropped:
            peer = min(self._dropped)
            raise PeerError(
                f"rank {self.rank}: link to rank {peer} was dropped before {call.describe()}",
                rank=self.rank,
                peer=peer,
                seq=call.seq,
                op=call.op,
                why="the link was dropped",
                fault="link_dropped",
            )
        rings, local = self._rings, self._local
        items: list[Outgoing | Incoming] = []
        for peer, view in sends:
            items.append(Outgoing(rings, local[peer], view, wire.pack(call, step, len(view))))
            self._sent[peer] += len(view)
        for peer, view in recvs:
            items.append(Incoming(rings, local[peer], view, call, step))
            self._received[peer] += len(view)
        watched = {item.peer for item in items} if wait.partners_only else None
        return ShmStep(self.group, call, items, watched)

    def drop_link(self, peer: int) -> None:
        """Fault injection: this rank's next step fails, and so do its peers' waits on it."""
        self._dropped.add(peer)
        self.capabilities = POINT_TO_POINT

    def link_bytes(self) -> tuple[list[int], list[int]]:
        return list(self._sent), list(self._received)

    def announce(self, status: str, revocation: Revocation | None) -> None:
        if not self._closed:  # once closed, the segments are unmapped
            self.group.peers.announce(status, revocation)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.group.close()
