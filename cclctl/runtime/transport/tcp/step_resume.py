"""A step's link made again after a reset, and the tails kept for one.

Where a reset broke a link mid-step (:mod:`~cclctl.runtime.transport.tcp.resume`: the new
connection and the cursors), the step that met it reads what the old socket still holds
into the link's receive, agrees with the peer on what was lost, and moves both ways of the
link on to the new connection: its own transfers and another thread's step's
(:mod:`~cclctl.runtime.transport.tcp.flow`; the caller holds the link's lock). As a step
ends it keeps the unacknowledged end of each large message it sent on a plain link, the
only bytes of it a later reset can lose once the buffer is the caller's again: a copy, or
a view where the call's memory stays as sent until every peer holds it.
"""

from __future__ import annotations

import errno
import socket
from typing import Protocol

import numpy as np

from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp import resume
from cclctl.runtime.transport.tcp.flow import Outgoing
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.mac import LinkMac
from cclctl.runtime.transport.tcp.messages import MacRecv, MacSend, Recv, Send, outgoing
from cclctl.runtime.transport.tcp.resume import Cursor, stream_from, unacked
from cclctl.runtime.transport.wait import Span

#: Messages from this size on keep their unacknowledged tail as their step ends (a copy of
#: at most a socket buffer, small beside the message); a smaller one whose tail a reset
#: drops goes to the retry instead, whose re-run costs little at that size.
TAIL_MIN_BYTES = 1 << 20


class TcpStep(Protocol):
    """What a resume reads and moves of the step that met the reset (a
    :class:`~cclctl.runtime.transport.tcp.step.TcpStep`)."""

    links: Links
    call: wire.Call
    wait: Wait
    pending: list[Send | Recv]
    done: bool

    def ended(self, item: Send | Recv) -> None:
        """``item`` is whole: the step drops it."""
        ...


def resume_link(step: TcpStep, peer: int) -> None:
    """Make the link to ``peer`` again, agree on what was lost with it, and go on with
    the transfers to and from it, ``step``'s and another thread's: on a plain link from the
    byte the other side reached (a kept tail first), on a MAC link each message again
    whole. Raises OSError (or HandshakeRefused) where it cannot."""
    links = step.links
    flow = links.flow(peer)
    out, inc = flow.send, flow.recv
    plain = links.session(peer) is None
    recv = inc.item if inc is not None and not inc.item.finished else None
    if recv is not None and plain:
        _drain(step, recv)  # on a MAC link it comes again whole: the old socket is no use
    partial = recv.got if recv is not None and not recv.finished and plain else 0
    mine, theirs, owed = resume.resume(
        links, peer, step.call, step.wait, out.index if out is not None else -1, partial
    )
    sock = links.socks[peer]
    if out is not None:
        _send_again(step, out, sock, mine, theirs, owed)
    elif owed:
        step.pending.append(_sending(sock, peer, owed))
    if recv is not None and not recv.finished:
        if isinstance(recv, MacRecv):
            recv.again_whole(sock, _session(links, peer))
        else:
            recv.sock = sock  # it goes on where it was: the peer sends from that byte
    step.done = not step.pending


def _drain(step: TcpStep, recv: Recv) -> None:
    """Read what the broken link's socket still holds (what the peer's kernel had and the
    reset left) into ``recv`` (``step``'s receive from the peer, or another thread's
    step's), so a resume goes on from there; one that this completes is counted and
    finished here, and dropped by the step it is in."""
    while not recv.finished:
        try:
            moved = recv.advance()
        except OSError:  # drained (or no more to read)
            return
        if moved < 0:
            recv.finished = True
            step.links.received[recv.peer] += 1
            if recv in step.pending:
                step.ended(recv)


def _send_again(
    step: TcpStep,
    out: Outgoing,
    sock: socket.socket,
    mine: Cursor,
    theirs: Cursor,
    owed: list[memoryview],
) -> None:
    """Move the message ``out`` on to the new link: what the peer lacks of it again (after
    what it lacks of the last message's kept tail), or nothing where the peer has it whole."""
    item, peer = out.item, out.item.peer
    if not resume.resend(mine, theirs):
        if owed:
            step.pending.append(_sending(sock, peer, owed))
        if not item.finished:
            item.finished = True  # the step it is in drops it (this one: now)
            if item in step.pending:
                step.ended(item)
        return
    if item.finished:  # sent whole in this step and lost with the link: a new item
        if out.owner is not step:
            # Only a step of several links ends one of its sends before the others, and
            # such a step (a collective's) is the only one on its links.
            raise OSError(errno.EPROTO, f"rank {peer} lacks a message another step ended")
        item = out.item = outgoing(sock, peer, out.header, out.view, step.links.session(peer))
        step.pending.append(item)
    elif isinstance(item, MacSend):
        item.again_whole(sock, out.header, _session(step.links, peer))
    if isinstance(item, MacSend):
        return  # whole, under the new link's session
    at = theirs.partial if theirs.received == out.index else 0
    whole = [memoryview(out.header), out.view] if len(out.view) else [memoryview(out.header)]
    item.again(sock, owed + stream_from(whole, at))


def keep_tails(
    links: Links, sends: dict[int, tuple[int, bytes, memoryview]], settled: Span | None = None
) -> None:
    """As a step ends: keep the bytes of each message it sent (``sends``) that the peer's
    kernel has not yet acknowledged (plain links only: a MAC link's message goes again
    whole). A copy of them, unless they lie in ``settled``: the call's memory that holds
    only its final bytes until every peer holds them whole (``Wait.settled``); a view of
    them there serves a resume within the call, and after it the peer lacks none of them.
    """
    for peer, (index, header, view) in sends.items():
        if len(view) < TAIL_MIN_BYTES:
            links.tails.pop(peer, None)
            continue
        sock = links.socks.get(peer)
        plain = links.session(peer) is None
        pending = unacked(sock) if sock is not None and plain else 0
        if pending <= 0:
            links.tails.pop(peer, None)
            continue
        total = len(header) + len(view)
        start = total - min(pending, total)
        tail = stream_from([memoryview(header), view], start)  # the header is immutable
        if not _within(view, settled):
            tail = [memoryview(b"".join(tail))]
        links.tails[peer] = (index, start, tail)


def _sending(sock: socket.socket, peer: int, owed: list[memoryview]) -> Send:
    """A send of ``owed`` (what the peer lacks of a kept tail) on the new link ``sock``."""
    send = Send(sock, peer, b"", memoryview(b""))
    send.again(sock, owed)
    return send


def _within(view: memoryview, span: Span | None) -> bool:
    """``view``'s bytes lie in ``span``."""
    if span is None:
        return False
    at = np.frombuffer(view, np.uint8).ctypes.data if view.nbytes else 0
    return span[0] <= at and at + view.nbytes <= span[1]


def _session(links: Links, peer: int) -> LinkMac:
    session = links.session(peer)
    assert session is not None, "a MAC link's new connection has a session"
    return session
