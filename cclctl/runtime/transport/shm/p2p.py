"""Point-to-point messages between ranks of one host: a ring of slots per pair.

A message to a local peer goes, chunk by chunk, through the ring of slots that peer reads,
so a message of any size streams with bounded memory. :class:`ShmStep` is the shared-memory
share of one step (a :class:`~cclctl.runtime.transport.base.Progress`).
"""

from __future__ import annotations

from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.shm.group import ShmGroup
from cclctl.runtime.transport.shm.layout import HEADER


class Rings:
    """Where this rank's rings stand: chunks written to and read from each local peer."""

    def __init__(self, group: ShmGroup) -> None:
        self.group = group
        self.sent = [0] * group.size
        self.received = [0] * group.size


class ShmStep:
    """The shared-memory share of one step: its messages in and out, moved as slots free."""

    __slots__ = ("call", "done", "group", "items", "watched")

    def __init__(
        self,
        group: ShmGroup,
        call: wire.Call,
        items: list[Outgoing | Incoming],
        watched: set[int] | None = None,
    ) -> None:
        """``watched``: the peers whose failure ends the step (None: every peer's)."""
        self.group = group
        self.call = call
        self.items = items
        self.done = not items
        self.watched = watched

    def advance(self) -> bool:
        """Move every chunk that can move now; drop finished items; True if anything moved."""
        items = self.items
        progressed = False
        for item in list(items):
            if item.advance():
                progressed = True
            if item.done:
                items.remove(item)
        self.done = not items
        if progressed:
            self.group.peers.notify()
        return progressed

    def waiting_on(self) -> tuple[int, str]:
        first = next((i for i in self.items if isinstance(i, Incoming)), self.items[0])
        return first.peer, first.what

    def check(self) -> None:
        items = self.items
        ready = lambda: any(i.ready() for i in items)  # noqa: E731
        partners = [i.peer for i in items]
        self.group.peers.check_peers(self.call, items[0].peer, ready, self.watched, partners)

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        """Sleep until a chunk of the share can move (at most ``slice_s`` when given)."""
        items = self.items
        limit = float("inf") if slice_s is None else slice_s
        ready = lambda: any(i.ready() for i in items)  # noqa: E731
        partners = [i.peer for i in items]
        self.group.peers.block(ready, peer, what, self.call, wait, limit, self.watched, partners)


class Outgoing:
    """A message to a local peer, written chunk by chunk into the slots it reads."""

    __slots__ = ("chunks", "done", "header", "j", "peer", "pos", "t", "view")
    what = "send"

    def __init__(self, t: Rings, j: int, view: memoryview, header: bytes) -> None:
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
        sent = self.t.sent[self.j]
        return g.views[self.j].q[lay.q_received(g.local)] + lay.p2p_slots > sent

    def advance(self) -> bool:
        t, g = self.t, self.t.group
        lay, me = g.layout, g.me
        cp = lay.p2p_bytes
        moved = False
        while self.pos < self.chunks and self.ready():
            sent = t.sent[self.j]
            off = lay.p2p_slot(self.j, sent)
            me.mv[off : off + wire.HEADER_SIZE] = self.header
            lo = self.pos * cp
            part = self.view[lo : lo + cp]
            me.mv[off + HEADER : off + HEADER + len(part)] = part
            t.sent[self.j] = sent + 1
            me.q[lay.q_sent(self.j)] = sent + 1
            self.pos += 1
            moved = True
        self.done = self.pos == self.chunks
        return moved


class Incoming:
    """A message from a local peer, copied out of its slots as they fill."""

    __slots__ = ("call", "chunks", "done", "j", "peer", "pos", "step", "t", "view")
    what = "recv"

    def __init__(self, t: Rings, j: int, view: memoryview, call: wire.Call, step: int):
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
        return g.views[self.j].q[g.layout.q_sent(g.local)] > self.t.received[self.j]

    def advance(self) -> bool:
        t, g = self.t, self.t.group
        lay, src = g.layout, g.views[self.j]
        cp = lay.p2p_bytes
        moved = False
        while self.pos < self.chunks and self.ready():
            got = t.received[self.j]
            off = lay.p2p_slot(g.local, got)
            if self.pos == 0:
                expected = wire.pack(self.call, self.step, len(self.view))
                g.check_header(src, off, expected, self.call, self.step, len(self.view))
            lo = self.pos * cp
            n = min(cp, len(self.view) - lo)
            self.view[lo : lo + n] = src.mv[off + HEADER : off + HEADER + n]
            t.received[self.j] = got + 1
            g.me.q[lay.q_received(self.j)] = got + 1
            self.pos += 1
            moved = True
        self.done = self.pos == self.chunks
        return moved
