"""The TCP transport: every step's sends and receives driven together on non-blocking sockets.

One thread moves all transfers of a step: it pushes and pulls bytes on every socket that can
make progress and only then blocks in ``poll``. Payloads go straight from and into the
caller's buffers (``sendmsg`` with the header, ``recv_into`` a memoryview), so large messages
are never copied in user space. On links with a MAC session (``CCLCTL_LINK_MAC=1``) every
message is followed by its tag, checked before the payload counts as received.
"""

from __future__ import annotations

import contextlib
import errno
import select
import threading
import time
from collections.abc import Sequence

from cclctl.errors import PeerError, ProtocolError
from cclctl.revocation import Revocation
from cclctl.runtime.transport import stall, wire
from cclctl.runtime.transport.base import Transfer, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT
from cclctl.runtime.transport.drive import DrivenAlone
from cclctl.runtime.transport.tcp_links import Links
from cclctl.runtime.transport.tcp_messages import MacRecv, MacSend, Recv, Send

_POLL_SLICE_S = 0.5  # how often a blocked step re-checks its deadline and abort flag
_STALL_LOOK_S = 0.1  # how often a waiting step reads its links' TCP_INFO for a stall


class TcpStep:
    """The TCP share of one step (a :class:`~cclctl.runtime.transport.base.Progress`)."""

    __slots__ = ("call", "done", "links", "look_at", "pending", "rank")

    def __init__(self, links: Links, call: wire.Call, pending: list[Send | Recv]) -> None:
        self.links = links
        self.rank = links.rank
        self.call = call
        self.pending = pending
        self.done = not pending
        self.look_at = 0.0  # when a wait next looks for a stalled link (time.monotonic())

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
                # Half a foreign message is on the wire: the failure's announce closes
                # every link, so the peer fails at once instead of waiting for a reply.
                pending.remove(item)
                raise
            progressed = True
            if moved < 0:
                pending.remove(item)
        self.done = not pending
        return progressed

    def waiting_on(self) -> tuple[int, str]:
        first = next((p for p in self.pending if isinstance(p, Recv)), self.pending[0])
        return first.peer, "recv" if isinstance(first, Recv) else "send"

    def check(self) -> None:
        """Nothing to look at: a failed peer shows as an error on its socket."""

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        """Wait until a socket of the share can move, at most ``slice_s``."""
        slice_s = _POLL_SLICE_S if slice_s is None else slice_s
        left = wait.check(self.call, peer, what)
        if self.links.stall_ms:
            self._look_for_stalls()
        poller = select.poll()
        events: dict[int, int] = {}
        for item in self.pending:
            flag = select.POLLIN if isinstance(item, Recv) else select.POLLOUT
            events[item.sock.fileno()] = events.get(item.sock.fileno(), 0) | flag
        events[wait.failure.wake_fd] = select.POLLIN  # the failure state wakes it at once
        for fd, mask in events.items():
            poller.register(fd, mask)
        poller.poll(int(min(left, slice_s) * 1000) + (1 if slice_s >= 0.001 else 0))

    def _look_for_stalls(self) -> None:
        """Break a link whose bytes in flight nobody acknowledges (a retry renews it), at
        most every :data:`_STALL_LOOK_S` while the step waits. A link with nothing in
        flight is probed by the kernel's keepalives instead (see ``Links``)."""
        now = time.monotonic()
        if now < self.look_at:
            return
        self.look_at = now + _STALL_LOOK_S
        after_ms = self.links.stall_ms
        for item in list(self.pending):  # a receive's link may hold this rank's last send
            if stall.stalled(item.sock, after_ms):
                why = f"nothing sent on it was acknowledged for {after_ms / 1000:g}s"
                self._broken(item, OSError(errno.ETIMEDOUT, why))

    def _broken(self, item: Send | Recv, exc: OSError) -> None:
        self.links.drop(item.peer)
        self.pending.remove(item)
        what = "receiving from" if isinstance(item, Recv) else "sending to"
        call = self.call
        why = exc.strerror or str(exc)
        raise PeerError(
            f"rank {self.rank}: link to rank {item.peer} broke while {what} it in "
            f"{call.describe()}: {why}",
            rank=self.rank,
            peer=item.peer,
            seq=call.seq,
            op=call.op,
            why=why,
        ) from None


class TcpTransport(DrivenAlone):
    """Transport over one TCP connection per pair of ranks that talk."""

    name = "tcp"
    capabilities = POINT_TO_POINT

    def __init__(self, links: Links) -> None:
        self._links = links
        self.rank = links.rank
        self._sent = [0] * links.world_size
        self._received = [0] * links.world_size
        self._step: TcpStep | None = None  # the step started last (announce reads it)
        self._owner = threading.get_ident()  # the thread that runs the calls (see start)
        self._revoked = False

    @property
    def address(self) -> str:
        return self._links.address

    def set_peers(self, addresses: Sequence[str]) -> None:
        self._links.peers = list(addresses)

    def start(
        self,
        call: wire.Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> TcpStep:
        """The transfers of one step, linked but not yet moved."""
        self._owner = threading.get_ident()
        pending: list[Send | Recv] = []
        links = self._links
        for peer, view in sends:
            sock = links.get(peer, call, wait)
            header = wire.pack(call, step, len(view))
            session = links.session(peer)
            pending.append(
                Send(sock, peer, header, view)
                if session is None
                else MacSend(sock, peer, header, view, session)
            )
            self._sent[peer] += len(view)
        for peer, view in recvs:
            sock = links.get(peer, call, wait)
            session = links.session(peer)
            pending.append(
                Recv(sock, peer, view, call, step, self.rank)
                if session is None
                else MacRecv(sock, peer, view, call, step, self.rank, session)
            )
            self._received[peer] += len(view)
        self._step = step_ = TcpStep(self._links, call, pending)
        return step_

    def drop_link(self, peer: int) -> None:
        self._links.drop(peer)

    def link_bytes(self) -> tuple[list[int], list[int]]:
        return list(self._sent), list(self._received)

    def announce(self, status: str, revocation: Revocation | None) -> None:
        """Send ``revocation`` on every link whose outgoing stream is between messages (a
        peer reading it then raises naming the origin), then close the links, so a peer
        waiting on this rank learns at once. Only the thread that runs the calls writes to
        the sockets: from another thread (the watchdog, the store's listener) this waits
        until the call it interrupts fails there and announces again. Links with a MAC get
        no frame (it would carry none): their peers hear of it through the store."""
        if self._revoked or threading.get_ident() != self._owner:
            return
        self._revoked = True
        links = self._links
        busy = self._mid_message()
        frame = b""
        if revocation is not None and status == "broken":
            frame = wire.pack_revoke(
                wire.comm_tag(revocation.comm), revocation.epoch, revocation.encode()
            )
        for peer, sock in links.open_links():
            if frame and peer not in busy and links.session(peer) is None:
                with contextlib.suppress(OSError):
                    sock.send(frame)  # small: it fits the socket's buffer, or is dropped
        links.drop_all()

    def _mid_message(self) -> set[int]:
        """Peers whose outgoing message the last step left half sent."""
        step = self._step
        if step is None:
            return set()
        return {p.peer for p in step.pending if isinstance(p, Send) and p.begun}

    def close(self) -> None:
        self._links.close()
