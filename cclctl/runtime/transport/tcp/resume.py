"""Resuming a TCP link that a reset broke mid-step: the lost messages go again, nothing re-runs.

A connection that a reset ended (``ss -K``, a NIC or middlebox reset, a peer's kernel
dropping it) loses what was in flight, while both ranks live and the route works. Each side
counts the messages it started on the link and the ones it received whole; after a new
connection (the lower rank connects, the handshake of
:mod:`~cclctl.runtime.transport.tcp.link_auth` as ever) both send a :class:`Cursor`: those
counts, the bytes in hand of the message being received, and what the side can still send:
the message of the step it is in (its buffer stays untouched until the step ends) and,
where a step ended with the last bytes of a message still unacknowledged in the kernel's
send queue, a copy of those bytes (the tail). What the peer lacks goes again, the same
bytes, so the result is the one a fault-free run gives: on a plain link from the byte the
receiver reached, on a link with MACs (whose tag covers the whole message) the message
whole, under the new link's session. A message its sender no longer holds makes the link
one that cannot be resumed, and the fault goes on to the retry
(:mod:`cclctl.runtime.comm.recovery.retrying`), which re-runs the call. A stalled link (nothing
acknowledged) is never resumed here: the retry's budget bounds that wait.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import logging
import select
import socket
import struct
import termios
import time

from cclctl.errors import ProtocolError
from cclctl.runtime.peer_process import exit_reason
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp.link_auth import HandshakeRefused
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.mac import TAG_BYTES, LinkMac, tag_of
from cclctl.runtime.transport.wire import Call

log = logging.getLogger("cclctl.links")

#: The errors of a connection that a reset or close ended (not a stall, not a refusal).
RESUMED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})
#: magic, messages started, message held (-1: none), messages received, bytes in hand of
#: the next, message of the kept tail (-1: none), the tail's first byte in that message
_FRAME = struct.Struct("<4sQqQQqQ")
_MAGIC = b"CCLr"
_SLICE_S = 0.05  # how often a resume that waits looks at the failure state


def resumable(exc: OSError) -> bool:
    """True for a connection that a reset or a close ended, which a new one may replace."""
    return exc.errno in RESUMED_ERRNOS or isinstance(exc, ConnectionError)


@dataclasses.dataclass(frozen=True, slots=True)
class Cursor:
    """One side's messages on a link: how many it started to the peer, the one it still
    holds whole (its index; -1: none), how many it received whole from the peer and the
    bytes in hand of the next (``partial``: header and payload as they came), and the
    message whose tail it kept (-1: none) with the tail's first byte (``tail_from``)."""

    started: int
    held: int
    received: int
    partial: int = 0
    tail: int = -1
    tail_from: int = 0

    def pack(self) -> bytes:
        return _FRAME.pack(_MAGIC, self.started, self.held, self.received, self.partial,
                           self.tail, self.tail_from)  # fmt: skip

    @classmethod
    def unpack(cls, data: bytes, peer: int) -> Cursor:
        magic, started, held, received, partial, tail, tail_from = _FRAME.unpack(data)
        if magic != _MAGIC or not -1 <= held < started or not -1 <= tail < started:
            raise ProtocolError(f"rank {peer} sent a malformed resume frame", peer=peer)
        return cls(started, held, received, partial, tail, tail_from)


def from_tail(sender: Cursor, receiver: Cursor) -> bool:
    """The receiver's next message from ``sender`` is the one whose tail the sender kept,
    and it has every byte before the tail."""
    return sender.tail == receiver.received and sender.tail_from <= receiver.partial


def lost(sender: Cursor, receiver: Cursor) -> bool:
    """The receiver's next message from ``sender`` is gone: started, and neither held nor
    kept from a byte the receiver reached (or something after it is missing too)."""
    need = receiver.received
    if sender.started == need:  # not started: nothing of it can be in hand
        return receiver.partial != 0
    if sender.held == need:
        return False
    if from_tail(sender, receiver):  # then the held message, if any, follows whole
        return not (sender.started == need + 1 or sender.held == need + 1)
    return True


def problem(mine: Cursor, theirs: Cursor, rank: int, peer: int) -> str:
    """Why the link cannot be resumed from these cursors ("" when it can); both sides
    read the same two cursors, so both come to the same answer."""
    if theirs.received > mine.started or mine.received > theirs.started:
        return f"rank {peer}'s count of messages disagrees with rank {rank}'s"
    for sender, receiver, (s, r) in ((mine, theirs, (rank, peer)), (theirs, mine, (peer, rank))):
        if lost(sender, receiver):
            return (
                f"message {receiver.received} from rank {s} to rank {r} was lost with the "
                f"connection after rank {s} had moved on"
            )
    return ""


def resend(mine: Cursor, theirs: Cursor) -> bool:
    """The peer still needs the message this side holds (all of it, or from its tail on)."""
    return mine.held >= 0 and theirs.received <= mine.held


def exchange(
    sock: socket.socket, mine: Cursor, session: LinkMac | None, call: Call, peer: int,
    wait: Wait, deadline: float,
) -> Cursor:  # fmt: skip
    """Send ``mine`` on the new connection and read the peer's cursor, each followed by its
    MAC on a link with a session (the new connection's first message each way). Waits at
    most until ``deadline`` and gives up at once if the communicator fails; raises
    OSError (``ETIMEDOUT``) when the peer does not answer in time."""
    frame = mine.pack()
    if session is not None:
        mac = session.send_mac()
        mac.update(frame)
        frame += tag_of(mac)
    size = _FRAME.size + (TAG_BYTES if session is not None else 0)
    _send_all(sock, frame, call, peer, wait, deadline)
    got = _recv_exact(sock, size, call, peer, wait, deadline)
    if session is not None:
        seq, mac = session.recv_mac()
        mac.update(got[: _FRAME.size])
        session.check(seq, mac, got[_FRAME.size :])
    return Cursor.unpack(got[: _FRAME.size], peer)


def _ready(sock: socket.socket, event: int, call: Call, peer: int, what: str, wait: Wait,
           deadline: float) -> None:  # fmt: skip
    """Until ``sock`` can move (``event``), looking at the failure state every slice."""
    poller = select.poll()
    poller.register(sock.fileno(), event)
    while True:
        wait.check(call, peer, what)
        left = deadline - time.monotonic()
        if left <= 0:
            raise OSError(errno.ETIMEDOUT, f"rank {peer} did not resume the link in time")
        if poller.poll(int(min(left, _SLICE_S) * 1000) + 1):
            return


def _send_all(sock: socket.socket, data: bytes, call: Call, peer: int, wait: Wait,
              deadline: float) -> None:  # fmt: skip
    view = memoryview(data)
    while view:
        _ready(sock, select.POLLOUT, call, peer, "send", wait, deadline)
        try:
            view = view[sock.send(view) :]
        except (BlockingIOError, InterruptedError):
            continue


def _recv_exact(sock: socket.socket, size: int, call: Call, peer: int, wait: Wait,
                deadline: float) -> bytes:  # fmt: skip
    data = bytearray()
    while len(data) < size:
        _ready(sock, select.POLLIN, call, peer, "recv", wait, deadline)
        try:
            chunk = sock.recv(size - len(data))
        except (BlockingIOError, InterruptedError):
            continue
        if not chunk:
            raise ConnectionResetError("the peer closed the new connection")
        data += chunk
    return bytes(data)


def stream_from(parts: list[memoryview], offset: int) -> list[memoryview]:
    """``parts`` (a message's bytes in order) from byte ``offset`` on, empty parts dropped."""
    out = []
    for part in parts:
        if offset >= len(part):
            offset -= len(part)
            continue
        out.append(part[offset:])
        offset = 0
    return out


def unacked(sock: socket.socket) -> int:
    """Bytes in ``sock``'s send queue that the peer's kernel has not acknowledged."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", raw)[0])


def resume(
    links: Links, peer: int, call: Call, wait: Wait, held: int, partial: int = 0
) -> tuple[Cursor, Cursor, list[memoryview]]:
    """Make the link to ``peer`` again within the links' ``resume_s`` and exchange cursors
    (``held``: the index of this side's message of the step to ``peer``, -1: none;
    ``partial``: the bytes in hand of the message it is receiving); (this side's cursor,
    the peer's, what the peer lacks of this side's kept tail: to send first). Raises
    OSError when the messages cannot be made whole."""
    began = time.monotonic()
    deadline = began + links.resume_s
    tail = links.tails.pop(peer, None)
    sock = links.reopen(peer, call, wait, deadline, lambda: _gone(wait, peer))
    mine = Cursor(links.started[peer], held, links.received[peer], partial,
                  *((tail[0], tail[1]) if tail else (-1, 0)))  # fmt: skip
    theirs = exchange(sock, mine, links.session(peer), call, peer, wait, deadline)
    why = problem(mine, theirs, links.rank, peer)
    if why:
        raise OSError(errno.EPROTO, why)
    tail_first = tail is not None and from_tail(mine, theirs)
    owed = stream_from(tail[2], theirs.partial - tail[1]) if tail is not None and tail_first else []
    links.resumed[peer] += 1
    lacks = [
        what
        for what, lacked in (
            ("the end of its last message", tail_first),
            ("its message in flight", resend(mine, theirs)),
        )
        if lacked
    ]
    log.warning(
        "rank %d: the link to rank %d was reset in %s; made again in %.0f ms, %s",
        links.rank, peer, call.describe(), (time.monotonic() - began) * 1000,
        f"sending {' and '.join(lacks)} again" if lacks else "nothing was lost",
    )  # fmt: skip
    return mine, theirs, owed


def _gone(wait: Wait, peer: int) -> bool:
    """``peer``'s process is known to be gone (it ran on this host and exited)."""
    failure = wait.failure
    if not 0 <= peer < len(failure.peers) or not failure.host:
        return False
    host, pid = failure.peers[peer]
    return host == failure.host and exit_reason(pid) is not None


def why_not(exc: BaseException) -> str:
    """Why a link was not made again, in words."""
    if isinstance(exc, HandshakeRefused):
        return f"the peer refused the new link: {exc.why}"
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
