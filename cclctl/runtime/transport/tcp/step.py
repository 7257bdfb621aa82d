"""One TCP step: its sends and receives driven together on non-blocking sockets.

One thread moves all transfers of a step: it pushes and pulls bytes on every socket that can
make progress and only then blocks in ``poll``. Payloads go straight from and into the
caller's buffers (``sendmsg`` with the header, ``recv_into`` a memoryview), so large messages
are never copied in user space. On links with a MAC session (``CCLCTL_LINK_MAC=1``) every
message is followed by its tag, checked before the payload counts as received. A link that
a reset breaks mid-step is made again and what the peer lacks sent again
(:mod:`~cclctl.runtime.transport.tcp.step_resume`) where the links allow it (``resume_s``),
both ways at once, even where the other way is another thread's step (:mod:`.flow`).
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
from cclctl.runtime.transport.tcp import resume, stall, step_resume
from cclctl.runtime.transport.tcp.flow import Incoming, Outgoing
from cclctl.runtime.transport.tcp.link_auth import HandshakeRefused
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.messages import Recv, Send, incoming, outgoing
from cclctl.runtime.transport.tcp.resume import why_not

log = logging.getLogger("cclctl.links")

_POLL_SLICE_S = 0.5  # how often a blocked step re-checks its deadline and abort flag
_STALL_LOOK_S = 0.1  # how often a waiting step reads its links' TCP_INFO for a stall


class TcpStep:
    """The TCP share of one step (a :class:`~cclctl.runtime.transport.base.Progress`).

    It keeps every transfer of the step, finished or not, so a link that a reset breaks
    can be made again and what the peer lacks sent again (:mod:`.step_resume`); with resume on,
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
        # Each transfer takes its link's socket and shows itself to a resume under the
        # link's lock: a resume on another thread happens wholly before it or sees it.
        for peer, (index, header, view) in sends.items():
            flow = links.flow(peer)
            with flow.lock:
                out = outgoing(links.socks[peer], peer, header, view, links.session(peer))
                flow.send = Outgoing(self, out, index, header, view)
            self.pending.append(out)
        for peer, view in recvs.items():
            flow = links.flow(peer)
            with flow.lock:
                into = incoming(links.socks[peer], peer, view, call, step, links.rank,
                                links.session(peer))  # fmt: skip
                flow.recv = Incoming(self, into)
            self.pending.append(into)
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
        links = self.links
        for item in list(pending):
            if item not in pending:
                continue  # ended by a resume of its link
            with links.flow(item.peer).lock:  # a resume on another thread waits, or is done
                if item.finished:  # a resume on another thread found it whole
                    self.ended(item)
                    progressed = True
                    continue
                sock = item.sock
                try:
                    moved = item.advance()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    self._broken(item, exc, sock)
                    progressed = True
                    continue
                except ProtocolError:
                    # Half a foreign message is on the wire: the failure's announce closes
                    # every link, so the peer fails at once instead of waiting for a reply.
                    pending.remove(item)
                    raise
                progressed = True
                if moved < 0:
                    item.finished = True
                    if isinstance(item, Recv):
                        links.received[item.peer] += 1
                    self.ended(item)
                elif timed and isinstance(item, Recv) and not item.began:
                    item.began = perf_counter_ns()
        self.done = not pending
        if self.done:
            if self.sends and links.resume_s:
                step_resume.keep_tails(links, self.sends, self.wait.settled)
            self._release()
        return progressed

    def ended(self, item: Send | Recv) -> None:
        """``item`` is whole (counted on the link by whoever read its end): drop it."""
        self.pending.remove(item)
        if isinstance(item, Recv):
            self.recvd.add(item.peer)
            if item.began:
                transferred(self.wait, item.peer, perf_counter_ns() - item.began)

    def _release(self) -> None:
        """The step ended: its transfers are no longer its links' to resume."""
        links = self.links
        for peer in {*self.sends, *self.recvs}:
            flow = links.flow(peer)
            with flow.lock:
                flow.release(self)

    def _relinked(self) -> None:
        """Resume each link of the step whose peer linked again (it found the old one
        broken, so whatever this side sends on it is lost), after reading what the old
        socket still holds."""
        for item in list(self.pending):
            with self.links.flow(item.peer).lock:  # a resume on another thread took it?
                if item in self.pending and self.links.has_fresh(item.peer):
                    why = f"rank {item.peer} linked again: its side of the link broke"
                    self._broken(item, ConnectionResetError(errno.ECONNRESET, why), item.sock)

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
            fd = item.sock.fileno()  # -1: a resume on another thread closed it just now
            flag = select.POLLIN if isinstance(item, Recv) else select.POLLOUT
            if fd >= 0:
                events[fd] = events.get(fd, 0) | flag
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
            with self.links.flow(item.peer).lock:
                sock = item.sock
                if item in self.pending and stall.stalled(sock, after_ms):
                    why = f"nothing sent on it was acknowledged for {after_ms / 1000:g}s"
                    self._broken(item, OSError(errno.ETIMEDOUT, why), sock)

    def _broken(self, item: Send | Recv, exc: OSError, sock: socket.socket) -> None:
        """Resume the link of ``item`` where a reset broke it and the links allow; else (or
        when that fails) drop it and raise the fault, for the retry or the caller.
        ``sock``: the socket that failed; the caller holds the link's lock. Where a resume
        on another thread has moved ``item`` to a new link since, or found it whole, there
        is nothing to do."""
        if item.sock is not sock or item.finished or item not in self.pending:
            return
        why = exc.strerror or str(exc)
        if item.peer in self.links.dropped:
            why = f"this rank closed the link meanwhile ({why})"  # another thread's fault
        elif self.links.resume_s > 0 and resume.resumable(exc):
            try:
                step_resume.resume_link(self, item.peer)
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
