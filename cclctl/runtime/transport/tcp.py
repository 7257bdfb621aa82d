"""The TCP transport: every step's sends and receives driven together on non-blocking sockets.

One thread moves all transfers of a step: it pushes and pulls bytes on every socket that can
make progress and only then blocks in ``poll``. Payloads go straight from and into the
caller's buffers (``sendmsg`` with the header, ``recv_into`` a memoryview), so large messages
are never copied in user space.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Sequence

from cclctl.errors import PeerError, ProtocolError
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Transfer, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT
from cclctl.runtime.transport.tcp_links import Links

_POLL_SLICE_S = 0.5  # how often a blocked step re-checks its deadline and abort flag


class _Send:
    __slots__ = ("bufs", "peer", "sock")

    def __init__(self, sock: socket.socket, peer: int, header: bytes, view: memoryview) -> None:
        self.sock = sock
        self.peer = peer
        self.bufs: list[memoryview] = (
            [memoryview(header), view] if len(view) else [memoryview(header)]
        )

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
    __slots__ = ("call", "got", "header", "nbytes", "peer", "rank", "sock", "step", "view")

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
            got = wire.unpack(self.header, self.peer)
            wire.check(got, self.call, self.step, self.nbytes, self.rank, self.peer)
            if self.nbytes == 0:
                return -1
        n = self.sock.recv_into(self.view[self.got - hs :])
        if n == 0:
            raise ConnectionResetError("peer closed the connection")
        self.got += n
        return -1 if self.got - hs == self.nbytes else n


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
        pending = self.start(call, step, sends, recvs, wait)
        while pending:
            if not self.advance(pending, call) and pending:
                self.block(pending, call, wait)

    def start(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> list[_Send | _Recv]:
        """The transfers of one step, linked but not yet moved (the hybrid drives them too)."""
        pending: list[_Send | _Recv] = []
        for peer, view in sends:
            sock = self._links.get(peer, call, wait)
            pending.append(_Send(sock, peer, wire.pack(call, step, len(view)), view))
            self._sent[peer] += len(view)
        for peer, view in recvs:
            sock = self._links.get(peer, call, wait)
            pending.append(_Recv(sock, peer, view, call, step, self.rank))
            self._received[peer] += len(view)
        return pending

    def advance(self, pending: list[_Send | _Recv], call: wire.Call) -> bool:
        """Push and pull what the sockets take now; drop finished items; True if any moved."""
        progressed = False
        for item in list(pending):
            try:
                moved = item.advance()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                self._broken(item, call, exc)
            except ProtocolError:
                # Half a foreign message is on the wire: close the link so the peer
                # fails at once instead of waiting for a reply that will not come.
                self._links.drop(item.peer)
                raise
            progressed = True
            if moved < 0:
                pending.remove(item)
        return progressed

    def block(
        self,
        pending: list[_Send | _Recv],
        call: wire.Call,
        wait: Wait,
        slice_s: float = _POLL_SLICE_S,
    ) -> None:
        """Wait until a socket of ``pending`` can move, at most ``slice_s``."""
        first = next((p for p in pending if isinstance(p, _Recv)), pending[0])
        what = "recv" if isinstance(first, _Recv) else "send"
        wait.blocked_on(first.peer, what)
        left = wait.check(call, first.peer, what)
        poller = select.poll()
        events: dict[int, int] = {}
        for item in pending:
            flag = select.POLLIN if isinstance(item, _Recv) else select.POLLOUT
            events[item.sock.fileno()] = events.get(item.sock.fileno(), 0) | flag
        for fd, mask in events.items():
            poller.register(fd, mask)
        poller.poll(int(min(left, slice_s) * 1000) + (1 if slice_s >= 0.001 else 0))

    def _broken(self, item: _Send | _Recv, call: wire.Call, exc: OSError) -> None:
        self._links.drop(item.peer)
        what = "receiving from" if isinstance(item, _Recv) else "sending to"
        raise PeerError(
            f"rank {self.rank}: link to rank {item.peer} broke while {what} it in "
            f"{call.describe()}: {exc.strerror or exc}",
            rank=self.rank,
            peer=item.peer,
            seq=call.seq,
            op=call.op,
        ) from None

    def drop_link(self, peer: int) -> None:
        self._links.drop(peer)

    def link_bytes(self) -> tuple[list[int], list[int]]:
        return list(self._sent), list(self._received)

    def close(self) -> None:
        self._links.close()
