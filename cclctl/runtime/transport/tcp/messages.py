"""One message on a TCP link, sent or received a piece at a time by the step that drives it.

A send pushes the header and the payload with ``sendmsg`` straight from the caller's buffer;
a receive reads the header, checks it names the call this rank is in, then reads the
payload straight into the caller's buffer. The MAC variants (``CCLCTL_LINK_MAC=1``) feed
each piece to the link's MAC as it goes, and send or check the tag after the payload.
"""

from __future__ import annotations

import select
import socket
import time

from cclctl import revocation
from cclctl.errors import BadInput, CclError, ProtocolError
from cclctl.runtime.failure_errors import revoked
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.tcp.mac import TAG_BYTES, LinkMac, tag_of

_REVOKE_READ_S = 0.2  # a revoke frame is sent whole: the longest its rest may take to arrive


class Send:
    __slots__ = ("begun", "bufs", "finished", "peer", "sock")

    def __init__(self, sock: socket.socket, peer: int, header: bytes, view: memoryview) -> None:
        self.sock = sock
        self.peer = peer
        self.begun = False  # some of it is on the wire: the link is mid-message until done
        #: it needs no more moves: sent whole, or found whole at the peer by a resume
        self.finished = False
        self.bufs: list[memoryview] = (
            [memoryview(header), view] if len(view) else [memoryview(header)]
        )

    def again(self, sock: socket.socket, bufs: list[memoryview]) -> None:
        """Send ``bufs`` (what the peer lacks of it) on ``sock``, a link made again."""
        self.sock = sock
        self.bufs = bufs
        self.begun = False

    def advance(self) -> int:
        """Send what the socket takes now; return bytes sent (-1 once finished)."""
        sent = self.sock.sendmsg(self.bufs)
        self.begun = True
        while sent:
            head = self.bufs[0]
            if sent >= len(head):
                sent -= len(head)
                self.bufs.pop(0)
            else:
                self.bufs[0] = head[sent:]
                sent = 0
        return -1 if not self.bufs else 1


class Recv:
    __slots__ = (
        "began",
        "call",
        "expected",
        "finished",
        "got",
        "header",
        "nbytes",
        "peer",
        "rank",
        "sock",
        "step",
        "view",
    )

    def __init__(
        self,
        sock: socket.socket,
        peer: int,
        view: memoryview,
        call: wire.Call,
        step: int,
        rank: int,
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.view = view
        self.call = call
        self.step = step
        self.rank = rank
        self.nbytes = len(view)
        self.header = bytearray(wire.HEADER_SIZE)
        self.expected = wire.pack(call, step, self.nbytes)
        self.got = 0  # bytes of header + payload received so far
        #: it arrived whole (and was counted on the link), whichever step read its end
        self.finished = False
        #: perf_counter_ns() when its first bytes came, set by a step that times its
        #: messages' transfers (0: not timed, or it has not begun)
        self.began = 0

    def advance(self) -> int:
        hs = wire.HEADER_SIZE
        if self.got < hs:
            n = self.sock.recv_into(memoryview(self.header)[self.got :])
            if n == 0:
                raise ConnectionResetError("peer closed the connection")
            self.got += n
            if self.got < hs:
                return n
            if self.header != self.expected:
                got = wire.unpack(self.header, self.peer)
                if got.call.op == wire.REVOKE:
                    raise self._revoked(got.nbytes)
                wire.check(got, self.call, self.step, self.nbytes, self.rank, self.peer)
            if self.nbytes == 0:
                return -1
        n = self.sock.recv_into(self.view[self.got - hs :])
        if n == 0:
            raise ConnectionResetError("peer closed the connection")
        self.got += n
        return -1 if self.got - hs == self.nbytes else n

    def _revoked(self, nbytes: int) -> CclError:
        """The peer sent the record of the job's failure instead of the message: read it
        (it is small and sent whole) and raise it as this call's end."""
        where = f"rank {self.rank}: {self.call.what()} seq {self.call.seq}"
        if nbytes > revocation.MAX_BYTES:
            return ProtocolError(
                f"{where}: rank {self.peer} sent a {nbytes}-byte revoke frame", peer=self.peer
            )
        record = bytearray()
        deadline = time.monotonic() + _REVOKE_READ_S
        while len(record) < nbytes and time.monotonic() < deadline:
            select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(nbytes - len(record))
            except (BlockingIOError, InterruptedError):
                continue
            if not chunk:
                break
            record += chunk
        try:
            rev = revocation.decode(bytes(record), f"rank {self.peer}'s revoke frame")
        except BadInput as exc:
            return ProtocolError(f"{where}: {exc}", peer=self.peer)
        return revoked(
            where, rev, rank=self.rank, peer=self.peer, seq=self.call.seq, op=self.call.op
        )


class MacSend(Send):
    """A send whose message is followed by its MAC, fed with each piece as it goes out, so
    hashing overlaps what the kernel still has to send."""

    __slots__ = ("hashed", "mac", "tagged", "view")

    def __init__(
        self, sock: socket.socket, peer: int, header: bytes, view: memoryview, session: LinkMac
    ) -> None:
        super().__init__(sock, peer, header, view)
        self.mac = session.send_mac()
        self.mac.update(header)
        self.view = view
        self.hashed = 0  # payload bytes sent and hashed
        self.tagged = False

    def again_whole(self, sock: socket.socket, header: bytes, session: LinkMac) -> None:
        """Send the message again whole on ``sock``, a link made again, under its session
        (a MAC covers the whole message: a part of it is of no use)."""
        MacSend.__init__(self, sock, self.peer, header, self.view, session)

    def advance(self) -> int:
        if self.tagged:
            return super().advance()
        super().advance()
        left = sum(len(b) for b in self.bufs)  # of header and payload
        sent = len(self.view) - min(left, len(self.view))
        if sent > self.hashed:
            self.mac.update(self.view[self.hashed : sent])
            self.hashed = sent
        if not self.bufs:
            self.bufs.append(memoryview(tag_of(self.mac)))
            self.tagged = True
        return 1


class MacRecv(Recv):
    """A receive whose message is followed by its MAC, fed with each piece as it arrives
    and checked before the payload counts as received."""

    __slots__ = ("hashed", "mac", "msg_seq", "payload_done", "session", "tag", "tag_got")

    def __init__(
        self,
        sock: socket.socket,
        peer: int,
        view: memoryview,
        call: wire.Call,
        step: int,
        rank: int,
        session: LinkMac,
    ) -> None:
        super().__init__(sock, peer, view, call, step, rank)
        self.session = session
        self.msg_seq, self.mac = session.recv_mac()
        self.hashed = -1  # payload bytes hashed; -1 until the header is
        self.payload_done = False
        self.tag = bytearray(TAG_BYTES)
        self.tag_got = 0

    def again_whole(self, sock: socket.socket, session: LinkMac) -> None:
        """Receive the message again whole from ``sock``, a link made again, under its
        session (the peer sends it whole)."""
        MacRecv.__init__(self, sock, self.peer, self.view, self.call, self.step, self.rank,
                         session)  # fmt: skip

    def advance(self) -> int:
        if not self.payload_done:
            try:
                moved = super().advance()
            finally:
                self._feed()
            if moved >= 0:
                return moved
            self.payload_done = True
        n = self.sock.recv_into(memoryview(self.tag)[self.tag_got :])
        if n == 0:
            raise ConnectionResetError("peer closed the connection")
        self.tag_got += n
        if self.tag_got < TAG_BYTES:
            return n
        self.session.check(self.msg_seq, self.mac, bytes(self.tag))
        return -1

    def _feed(self) -> None:
        """Hash what arrived since the last call: the header once, then the payload."""
        got = self.got - wire.HEADER_SIZE
        if got < 0:
            return
        if self.hashed < 0:
            self.mac.update(self.header)
            self.hashed = 0
        if got > self.hashed:
            self.mac.update(self.view[self.hashed : got])
            self.hashed = got


def outgoing(
    sock: socket.socket, peer: int, header: bytes, view: memoryview, session: LinkMac | None
) -> Send:
    """A message to ``peer`` on a link with MAC ``session`` (None: a plain link)."""
    if session is None:
        return Send(sock, peer, header, view)
    return MacSend(sock, peer, header, view, session)


def incoming(
    sock: socket.socket,
    peer: int,
    view: memoryview,
    call: wire.Call,
    step: int,
    rank: int,
    session: LinkMac | None,
) -> Recv:
    """A message from ``peer`` into ``view`` on a link with MAC ``session`` (None: plain)."""
    if session is None:
        return Recv(sock, peer, view, call, step, rank)
    return MacRecv(sock, peer, view, call, step, rank, session)
