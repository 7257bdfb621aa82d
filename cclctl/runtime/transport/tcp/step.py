"""One TCP step: its sends and receives driven together on non-blocking sockets.

One thread moves all transfers of a step: it pushes and pulls bytes on every socket that can
make progress and only then blocks in ``poll``. Payloads go straight from and into the
caller's buffers (``sendmsg`` with the header, ``recv_into`` a memoryview), so large messages
are never copied in user space. On links with a MAC session (``CCLCTL_LINK_MAC=1``) every
message is followed by its tag, checked before the payload counts as received. A link that
a reset breaks mid-step is made again and what the peer lacks sent again
(:mod:`~cclctl.runtime.transport.tcp.resume`) where the links allow it (``resume_s``).
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import time
from time import perf_counter_ns

from cclctl.errors import PeerError, ProtocolError
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.drive import transferred
from cclctl.runtime.transport.tcp import resume, stall
from cclctl.runtime.transport.tcp.link_auth import HandshakeRefused
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.messages import MacRecv, MacSend, Recv, Send
from cclctl.runtime.transport.tcp.resume import stream_from, unacked, why_not

log = logging.getLogger("cclctl.links")

_POLL_SLICE_S = 0.5  # how often a blocked step re-checks its deadline and abort flag
#: Messages from this size on keep their unacknowledged tail as their step ends (a copy of
#: at most a socket buffer, small beside the message); a smaller one whose tail a reset
#: drops goes to the retry instead, whose re-run costs little at that size.
TAIL_MIN_BYTES = 1 << 20
_STALL_LOOK_S = 0.1  # how often a waiting step reads its links' TCP_INFO for a stall


def _send(links: Links, sock: socket.socket, peer: int, header: bytes, view: memoryview) -> Send:
    session = links.session(peer)
    if session is None:
        return Send(sock, peer, header, view)
    return MacSend(sock, peer, header, view, session)


def _recv(links: Links, sock: socket.socket, peer: int, view: memoryview, call: wire.Call,
          step: int) -> Recv:  # fmt: skip
    session = links.session(peer)
    if session is None:
        return Recv(sock, peer, view, call, step, links.rank)
    return MacRecv(sock, peer, view, call, step, links.rank, session)


class TcpStep:
    """The TCP share of one step (a :class:`~cclctl.runtime.transport.base.Progress`).

    It keeps every transfer of the step, finished or not, so a link that a reset breaks
    can be made again and what the peer lacks sent again (:meth:`_resume`); with resume on,
    a large message on a plain link whose bytes the peer's kernel has not all acknowledged
    as the step ends leaves a copy of those (its tail) for a resume after the step."""

    __slots__ = (
        "call", "done", "links", "look_at", "pending", "rank", "recvd", "recvs", "sends",
        "step", "wait",
    )  # fmt: skip

    def __init__(
        self,
        links: Links,
        call: wire.Call,
        step: int,
        wait: Wait,
        sends: dict[int, tuple[int, bytes, memoryview]],
        recvs: dict[int, memoryview],
    ) -> None:
        """``sends``: peer -> (the message's index on the link, header, payload);
        ``recvs``: peer -> the buffer its message goes into."""
        self.links = links
        self.rank = links.rank
        self.call = call
        self.step = step
        self.wait = wait
        self.sends = sends
        self.recvs = recvs
        self.recvd: set[int] = set()  # peers whose message of the step arrived whole
        self.pending: list[Send | Recv] = []
        for peer, (_, header, view) in sends.items():
            self.pending.append(_send(links, links.socks[peer], peer, header, view))
        for peer, view in recvs.items():
            self.pending.append(_recv(links, links.socks[peer], peer, view, call, step))
        self.done = not self.pending
        self.look_at = 0.0  # when a wait next looks for a stalled link (time.monotonic())

    def advance(self) -> bool:
        """Push and pull what the sockets take now; drop finished items; True if any moved.

        With the signals on (``wait.waits``), a message received over several calls is
        timed from the call that got its first bytes to the one that got its last (the
        link's time to deliver it; see ``drive.transferred``); one that arrives whole
        costs no clock read."""
        pending = self.pending
        progressed = False
        timed = self.wait.waits is not None
        if self.links.has_fresh():  # a peer linked again: its side of the old link broke
            self._relinked()
        for item in list(pending):
            if item not in pending:
                continue  # replaced by a resume of its link
            try:
                moved = item.advance()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                self._broken(item, exc)
                progressed = True
                continue
            except ProtocolError:
                # Half a foreign message is on the wire: the failure's announce closes
                # every link, so the peer fails at once instead of waiting for a reply.
                pending.remove(item)
                raise
            progressed = True
            if moved < 0:
                pending.remove(item)
                if isinstance(item, Recv):
                    self.links.received[item.peer] += 1
                    self.recvd.add(item.peer)
                    if item.began:
                        transferred(self.wait, item.peer, perf_counter_ns() - item.began)
            elif timed and isinstance(item, Recv) and not item.began:
                item.began = perf_counter_ns()
        self.done = not pending
        if self.done and self.sends and self.links.resume_s:
            self._keep_tails()
        return progressed

    def _relinked(self) -> None:
        """Resume each link of the step whose peer linked again (it found the old one
        broken, so whatever this side sends on it is lost), after reading what the old
        socket still holds."""
        for item in list(self.pending):
            if item in self.pending and self.links.has_fresh(item.peer):
                why = f"rank {item.peer} linked again: its side of the link broke"
                self._broken(item, ConnectionResetError(errno.ECONNRESET, why))

    def _receiving(self, peer: int) -> Recv | None:
        """This step's receive from ``peer`` while it is not complete."""
        return next((p for p in self.pending if p.peer == peer and isinstance(p, Recv)), None)

    def _drain(self, peer: int) -> Recv | None:
        """Read what the broken link's socket still holds (what the peer's kernel had and
        the reset left) into this step's receive from ``peer``, so a resume goes on from
        there; the receive, unless that completed it."""
        recv = self._receiving(peer)
        while recv is not None:
            try:
                moved = recv.advance()
            except OSError:  # drained (or no more to read)
                return recv
            if moved < 0:
                self.pending.remove(recv)
                self.links.received[peer] += 1
                self.recvd.add(peer)
                return None
        return None

    def _keep_tails(self) -> None:
        """As the step ends: keep a copy of the bytes of each message it sent that the
        peer's kernel has not yet acknowledged (plain links only: a MAC link's message goes
        again whole), the only bytes of it a later reset can lose once the buffer is the
        caller's again."""
        links = self.links
        for peer, (index, header, view) in self.sends.items():
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
            tail = b"".join(stream_from([memoryview(header), view], start))
            links.tails[peer] = (index, start, tail)

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
        """Resume the link of ``item`` where a reset broke it and the links allow; else (or
        when that fails) drop it and raise the fault, for the retry or the caller."""
        why = exc.strerror or str(exc)
        if self.links.resume_s > 0 and resume.resumable(exc):
            try:
                self._resume(item.peer)
                return
            except (OSError, HandshakeRefused) as failed:
                why += f"; not resumed: {why_not(failed)}"
                log.warning(
                    "rank %d: the link to rank %d was reset in %s; not made again: %s",
                    self.rank, item.peer, self.call.describe(), why_not(failed),
                )  # fmt: skip
        self.links.drop(item.peer)
        if item in self.pending:
            self.pending.remove(item)
        what = "receiving from" if isinstance(item, Recv) else "sending to"
        call = self.call
        raise PeerError(
            f"rank {self.rank}: link to rank {item.peer} broke while {what} it in "
            f"{call.describe()}: {why}",
            rank=self.rank,
            peer=item.peer,
            seq=call.seq,
            op=call.op,
            why=why,
            fault="link_broke",
            waiting_for="recv" if isinstance(item, Recv) else "send",
        ) from None

    def _resume(self, peer: int) -> None:
        """Make the link to ``peer`` again, agree on what was lost with it, and go on with
        this step's transfers to it: on a plain link from the byte the other side reached
        (a kept tail first), on a MAC link each message again whole."""
        links = self.links
        held = self.sends.get(peer)
        plain = links.session(peer) is None
        # On a MAC link the message goes again whole: what the old socket holds is no use.
        recv = self._drain(peer) if plain else self._receiving(peer)
        partial = recv.got if recv is not None and plain else 0
        mine, theirs, owed = resume.resume(
            links, peer, self.call, self.wait, held[0] if held else -1, partial
        )
        sock = links.socks[peer]
        self.pending[:] = [p for p in self.pending if p.peer != peer]
        if held is not None and resume.resend(mine, theirs):
            item = _send(links, sock, peer, held[1], held[2])
            if plain:  # from the byte the peer reached, after what it lacks of the last
                at = theirs.partial if theirs.received == held[0] else 0
                item.bufs = ([memoryview(owed)] if owed else []) + stream_from(item.bufs, at)
            self.pending.append(item)
        elif owed:
            self.pending.append(Send(sock, peer, owed, memoryview(b"")))
        if recv is not None and plain:
            recv.sock = sock  # it goes on where it was: the peer sends from that byte
            self.pending.append(recv)
        elif peer in self.recvs and peer not in self.recvd:
            self.pending.append(_recv(links, sock, peer, self.recvs[peer], self.call, self.step))
        self.done = not self.pending
