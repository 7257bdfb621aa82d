"""The shared-memory transport for ranks on one host.

Two paths share each rank's segment:

- **Point-to-point** (:meth:`ShmTransport.exchange`, the Transport interface): every
  algorithm runs unchanged. A message to a local peer goes through a ring of slots that
  peer reads, chunk by chunk, so a message of any size streams with bounded memory.
- **One-copy collectives** (:attr:`ShmTransport.capabilities`, ``algorithms/shared.py``):
  a rank copies its input into its own segment once, and every peer reduces or copies
  straight out of it with numpy's ``out=``: no extra copies, no messages.

Setup goes through the job's store: each rank creates its segment and publishes its name,
the peers map it, and once every local rank has said it mapped all of them each owner
unlinks its name, so nothing is left in ``/dev/shm`` however a rank later dies.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

from cclctl.errors import CclError, PeerError
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Transfer, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT, Capabilities
from cclctl.runtime.transport.shm import segment as shm_segment
from cclctl.runtime.transport.shm.futex import Futex
from cclctl.runtime.transport.shm.group import ShmGroup
from cclctl.runtime.transport.shm.layout import HEADER, W_PID, Layout, View

#: Publish ``value`` under ``key`` and return every rank's value by rank (all ranks call it).
Exchange = Callable[[str, bytes], list[bytes]]

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
    exchange: Exchange,
    *,
    layout: Layout | None = None,
    spin_s: float | None = None,
) -> tuple[ShmGroup | None, bool]:
    """Map the segments of ``local_ranks`` (with ``rank``); every rank of the job calls this
    together. Returns this rank's group (None when it is alone on its host) and whether every
    host succeeded: when any rank could not map a peer's segment, every rank learns it, so
    the whole job can fall back to TCP in agreement.
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
            View(own, layout, rank).init_owner()
        names = exchange("shm/segments", own.name.encode() if own else b"")
        problem = "" if own is not None or len(ranks) < 2 else "no writable /dev/shm"
        if own is not None:
            try:
                views = [_map(own, names[r].decode(), layout, r, rank) for r in ranks]
            except CclError as exc:
                problem = str(exc) or "cannot map"
        verdicts = exchange("shm/mapped", problem.encode())
        if own is not None:
            own.unlink()  # every local rank has mapped it, or given up
        every_host_ok = not any(verdicts)
        if own is None or not every_host_ok:
            for view in views:
                view.release()
            if own is not None:
                own.close()
            return None, every_host_ok
    except BaseException:
        for view in views:
            with contextlib.suppress(Exception):
                view.release()
        if own is not None:
            own.close()
        raise
    if spin_s is None:
        spin_s = 0.0 if oversubscribed else DEFAULT_SPIN_S
    group = ShmGroup(rank, ranks, views, layout, spin_s=spin_s, yield_s=YIELD_S, futex=Futex())
    return group, True


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


class ShmTransport:
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
        self.capabilities = Capabilities(one_copy=group) if spans else POINT_TO_POINT
        self._local = {r: i for i, r in enumerate(group.ranks)}
        self._sent_chunks = [0] * group.size
        self._recv_chunks = [0] * group.size
        self._sent = group.sent = [0] * world_size
        self._received = group.received = [0] * world_size
        self._dropped: set[int] = set()
        self._closed = False

    def is_local(self, peer: int) -> bool:
        return peer in self._local

    def exchange(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:
        pending = self.start(call, step, sends, recvs)
        while pending:
            progressed = self.advance(pending, call)
            if pending and not progressed:
                first = pending[0]
                self.group.block(
                    lambda: any(item.ready() for item in pending),
                    first.peer,
                    first.what,
                    call,
                    wait,
                )

    def start(
        self, call: wire.Call, step: int, sends: Sequence[Transfer], recvs: Sequence[Transfer]
    ) -> list[_Out | _In]:
        """The transfers of one step, not yet moved (the hybrid transport drives them too)."""
        if self._dropped:
            peer = min(self._dropped)
            self.group.fail()
            raise PeerError(
                f"rank {self.rank}: link to rank {peer} was dropped before {call.describe()}",
                rank=self.rank,
                peer=peer,
                seq=call.seq,
                op=call.op,
            )
        items: list[_Out | _In] = []
        for peer, view in sends:
            items.append(_Out(self, self._local[peer], view, wire.pack(call, step, len(view))))
            self._sent[peer] += len(view)
        for peer, view in recvs:
            items.append(_In(self, self._local[peer], view, call, step))
            self._received[peer] += len(view)
        return items

    def advance(self, pending: list[_Out | _In], call: wire.Call) -> bool:
        """Move every chunk that can move now; drop finished items; True if anything moved."""
        progressed = False
        for item in list(pending):
            moved = item.advance()
            if moved:
                progressed = True
            if item.done:
                pending.remove(item)
        if progressed:
            self.group.notify()
        return progressed

    def drop_link(self, peer: int) -> None:
        """Fault injection: this rank's next step fails, and so do its peers' waits on it."""
        self._dropped.add(peer)
        self.capabilities = POINT_TO_POINT

    def link_bytes(self) -> tuple[list[int], list[int]]:
        return list(self._sent), list(self._received)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.group.close()


class _Out:
    """A message to a local peer, written chunk by chunk into the slots it reads."""

    __slots__ = ("chunks", "done", "header", "j", "peer", "pos", "t", "view")
    what = "send"

    def __init__(self, t: ShmTransport, j: int, view: memoryview, header: bytes) -> None:
        self.t = t
        self.j = j
        self.peer = t.group.ranks[j]
        self.view = view
        self.header = header
        self.chunks = max(1, -(-len(view) // t.group.layout.p2p_bytes))
        self.pos = 0
        self.done = False

    def ready(self) -> bool:
        g = self.t.group
        lay = g.layout
        sent = self.t._sent_chunks[self.j]
        return g.views[self.j].q[lay.q_received(g.local)] + lay.p2p_slots > sent

    def advance(self) -> bool:
        t, g = self.t, self.t.group
        lay, me = g.layout, g.me
        cp = lay.p2p_bytes
        moved = False
        while self.pos < self.chunks and self.ready():
            sent = t._sent_chunks[self.j]
            off = lay.p2p_slot(self.j, sent)
            me.mv[off : off + wire.HEADER_SIZE] = self.header
            lo = self.pos * cp
            part = self.view[lo : lo + cp]
            me.mv[off + HEADER : off + HEADER + len(part)] = part
            t._sent_chunks[self.j] = sent + 1
            me.q[lay.q_sent(self.j)] = sent + 1
            self.pos += 1
            moved = True
        self.done = self.pos == self.chunks
        return moved


class _In:
    """A message from a local peer, copied out of its slots as they fill."""

    __slots__ = ("call", "chunks", "done", "j", "peer", "pos", "step", "t", "view")
    what = "recv"

    def __init__(self, t: ShmTransport, j: int, view: memoryview, call: wire.Call, step: int):
        self.t = t
        self.j = j
        self.peer = t.group.ranks[j]
        self.view = view
        self.call = call
        self.step = step
        self.chunks = max(1, -(-len(view) // t.group.layout.p2p_bytes))
        self.pos = 0
        self.done = False

    def ready(self) -> bool:
        g = self.t.group
        return g.views[self.j].q[g.layout.q_sent(g.local)] > self.t._recv_chunks[self.j]

    def advance(self) -> bool:
        t, g = self.t, self.t.group
        lay, src = g.layout, g.views[self.j]
        cp = lay.p2p_bytes
        moved = False
        while self.pos < self.chunks and self.ready():
            got = t._recv_chunks[self.j]
            off = lay.p2p_slot(g.local, got)
            if self.pos == 0:
                expected = wire.pack(self.call, self.step, len(self.view))
                g.check_header(src, off, expected, self.call, self.step, len(self.view))
            lo = self.pos * cp
            n = min(cp, len(self.view) - lo)
            self.view[lo : lo + n] = src.mv[off + HEADER : off + HEADER + n]
            t._recv_chunks[self.j] = got + 1
            g.me.q[lay.q_received(self.j)] = got + 1
            self.pos += 1
            moved = True
        self.done = self.pos == self.chunks
        return moved
