"""The TCP transport: every step's sends and receives driven together on non-blocking sockets.

One thread moves all transfers of a step: it pushes and pulls bytes on every socket that can
make progress and only then blocks in ``poll``. Payloads go straight from and into the
caller's buffers (``sendmsg`` with the header, ``recv_into`` a memoryview), so large messages
are never copied in user space. On links with a MAC session (``CCLCTL_LINK_MAC=1``) every
message is followed by its tag, checked before the payload counts as received.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Sequence

from cclctl.errors import PeerError, ProtocolError
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Transfer, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT
from cclctl.runtime.transport.drive import drive
from cclctl.runtime.transport.link_auth import TAG_BYTES, Session
from cclctl.runtime.transport.tcp_links import Links

_POLL_SLICE_S = 0.5  # how often a blocked step re-checks its deadline and abort flag


class _Send:
    __slots__ = ("bufs", "peer", "sock")

    def __init__(
        self, sock: socket.socket, peer: int, header: bytes, view: memoryview, tag: bytes = b""
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.bufs: list[memoryview] = (
            [memoryview(header), view] if len(view) else [memoryview(header)]
        )
        if tag:
            self.bufs.append(memoryview(tag))

    def advance(self) -> int:
        """Send what the socket takes now; return bytes sent (-1 once finished)."""
        sent = self.sock.sendmsg(self.bufs)
        while sent:
            head = self.bufs[0]
            if sent >= len(head):
                sent -= len(head)
                self.bufs.pop(0)
            else:
                self.bufs[0] = head[sent:]
                sent = 0
        return -1 if not self.bufs else 1


class _Recv:
    __slots__ = (
        "call",
        "expected",
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
                wire.check(got, self.call, self.step, self.nbytes, self.rank, self.peer)
            if self.nbytes == 0:
                return -1
        n = self.sock.recv_into(self.view[self.got - hs :])
        if n == 0:
            raise ConnectionResetError("peer closed the connection")
        self.got += n
        return -1 if self.got - hs == self.nbytes else n


class _MacRecv(_Recv):
    """A receive whose message is followed by its MAC, checked once the payload is in."""

    __slots__ = ("msg_seq", "payload_done", "session", "tag", "tag_got")

    def __init__(
        self,
        sock: socket.socket,
        peer: int,
        view: memoryview,
        call: wire.Call,
        step: int,
        rank: int,
        session: Session,
    ) -> None:
        super().__init__(sock, peer, view, call, step, rank)
        self.session = session
        self.msg_seq = session.next_recv()
        self.payload_done = False
        self.tag = bytearray(TAG_BYTES)
        self.tag_got = 0

    def advance(self) -> int:
        if not self.payload_done:
            moved = super().advance()
            if moved >= 0:
                return moved
            self.payload_done = True
        n = self.sock.recv_into(memoryview(self.tag)[self.tag_got :])
        if n == 0:
            raise ConnectionResetError("peer closed the connection")
        self.tag_got += n
        if self.tag_got < TAG_BYTES:
            return n
        self.session.check(self.msg_seq, self.header, self.view, bytes(self.tag))
        return -1


class TcpStep:
    """The TCP share of one step (a :class:`~cclctl.runtime.transport.base.Progress`)."""

    __slots__ = ("call", "done", "links", "pending", "rank")

    def __init__(self, links: Links, call: wire.Call, pending: list[_Send | _Recv]) -> None:
        self.links = links
        self.rank = links.rank
        self.call = call
        self.pending = pending
        self.done = not pending

    def advance(self) -> bool:
        """Push and pull what the sockets take now; drop finished items; True if any moved."""
        pending = self.pending
        progressed = False
        for item in list(pending):
            try:
                moved = item.advance()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                self._broken(item, exc)
            except ProtocolError:
                # Half a foreign message is on the wire: close the link so the peer
                # fails at once instead of waiting for a reply that will not come.
                self.links.drop(item.peer)
                raise
            progressed = True
            if moved < 0:
                pending.remove(item)
        self.done = not pending
        return progressed

    def waiting_on(self) -> tuple[int, str]:
        first = next((p for p in self.pending if isinstance(p, _Recv)), self.pending[0])
        return first.peer, "recv" if isinstance(first, _Recv) else "send"

    def check(self) -> None:
        """Nothing to look at: a failed peer shows as an error on its socket."""

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        """Wait until a socket of the share can move, at most ``slice_s``."""
        slice_s = _POLL_SLICE_S if slice_s is None else slice_s
        left = wait.check(self.call, peer, what)
        poller = select.poll()
        events: dict[int, int] = {}
        for item in self.pending:
            flag = select.POLLIN if isinstance(item, _Recv) else select.POLLOUT
            events[item.sock.fileno()] = events.get(item.sock.fileno(), 0) | flag
        for fd, mask in events.items():
            poller.register(fd, mask)
        poller.poll(int(min(left, slice_s) * 1000) + (1 if slice_s >= 0.001 else 0))

    def _broken(self, item: _Send | _Recv, exc: OSError) -> None:
        self.links.drop(item.peer)
        what = "receiving from" if isinstance(item, _Recv) else "sending to"
        call = self.call
        raise PeerError(
            f"rank {self.rank}: link to rank {item.peer} broke while {what} it in "
            f"{call.describe()}: {exc.strerror or exc}",
            rank=self.rank,
            peer=item.peer,
            seq=call.seq,
            op=call.op,
        ) from None


class TcpTransport:
    """Transport over one TCP connection per pair of ranks that talk."""

    name = "tcp"
    capabilities = POINT_TO_POINT

    def __init__(self, links: Links) -> None:
        self._links = links
        self.rank = links.rank
        self._sent = [0] * links.world_size
        self._received = [0] * links.world_size

    @property
    def address(self) -> str:
        return self._links.address

    def set_peers(self, addresses: Sequence[str]) -> None:
        self._links.peers = list(addresses)

    def exchange(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:
        drive((self.start(call, step, sends, recvs, wait),), wait)

    def start(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> TcpStep:
        """The transfers of one step, linked but not yet moved."""
        pending: list[_Send | _Recv] = []
        links = self._links
        for peer, view in sends:
            sock = links.get(peer, call, wait)
            header = wire.pack(call, step, len(view))
            session = links.session(peer)
            tag = session.sign(header, view) if session is not None else b""
            pending.append(_Send(sock, peer, header, view, tag))
            self._sent[peer] += len(view)
        for peer, view in recvs:
            sock = links.get(peer, call, wait)
            session = links.session(peer)
            pending.append(
                _Recv(sock, peer, view, call, step, self.rank)
                if session is None
                else _MacRecv(sock, peer, view, call, step, self.rank, session)
            )
            self._received[peer] += len(view)
        return TcpStep(self._links, call, pending)

    def drop_link(self, peer: int) -> None:
        self._links.drop(peer)

    def link_bytes(self) -> tuple[list[int], list[int]]:
        return list(self._sent), list(self._received)

    def announce(self, status: str) -> None:
        """Nothing to do: a TCP peer learns of a failure from the link itself."""

    def close(self) -> None:
        self._links.close()
