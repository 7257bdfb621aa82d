"""TCP connections between ranks: listen, connect, authenticate and identify peers.

Links are made on first use, so a 64-rank ring opens 2 links per rank rather than 63. The
lower rank of a pair always connects and the higher one accepts. A link is kept only after
the handshake of :mod:`~cclctl.runtime.transport.tcp.link_auth`: both ranks prove they hold the
job's token, and the acceptor files the link under the rank that proof established, not
under whoever connected first. A thread of its own answers every newcomer
(:mod:`~.accept`), so a connector never waits on what its acceptor is doing, a flood of
connections that prove nothing never takes a real peer's place, and a stranger's connection
(bad proof, wrong job, a rank already linked, garbage, silence past the deadline) is closed
and counted, and told in the log at a bounded rate (:mod:`~.refusals`), while the real
peer still links. With ``resume_s``, a link that a reset
broke is made again in its epoch (:meth:`Links.reopen`, :mod:`~.resume`): a linked
rank that proves itself again is kept aside for that.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence

from cclctl.errors import CclError, CommError, PeerError
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp import link_auth
from cclctl.runtime.transport.tcp.accept import POLL_S, Acceptor
from cclctl.runtime.transport.tcp.dial import Dialer, peer_error
from cclctl.runtime.transport.tcp.flow import Flow
from cclctl.runtime.transport.tcp.link_auth import HandshakeRefused, LinkContext
from cclctl.runtime.transport.tcp.mac import LinkMac
from cclctl.runtime.transport.tcp.refusals import RefusalLog
from cclctl.runtime.transport.tcp.sockets import listen, prepare
from cclctl.runtime.transport.wire import Call

log = logging.getLogger("cclctl.links")

#: Longest a handshake may take before the newcomer is dropped.
HANDSHAKE_TIMEOUT_S = 10.0
#: Handshakes held at once; a newcomer past them takes the place of the oldest unproven one.
MAX_PENDING_HANDSHAKES = 64
_RELINK_LOOK_S = 0.05  # how often a link awaited again looks at the failure state


class Links:
    """This rank's listening socket, the thread that authenticates newcomers, and the
    established links (with their MAC sessions when ``mac``), keyed by peer rank."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        job: str,
        host: str,
        connect_timeout_s: float,
        *,
        token: str,
        mac: bool = False,
        epoch: int = 0,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        stall_s: float = 0.0,
        resume_s: float = 0.0,
    ) -> None:
        """``stall_s``: a link whose bytes in flight stay unacknowledged this long while a
        step waits on it is broken, and an idle one whose peer's kernel stops answering
        keepalives about as soon (:mod:`~cclctl.runtime.transport.tcp.stall`); 0: never.
        ``resume_s``: how long a link that a reset broke may take to be made again
        (:mod:`~cclctl.runtime.transport.tcp.resume`); 0: never, the fault fails the step."""
        if not token:
            raise CommError(f"rank {rank}: no token for the job's links", rank=rank)
        self.rank = rank
        self.world_size = world_size
        self.stall_ms = int(stall_s * 1000)
        self.resume_s = resume_s
        flags = link_auth.FLAG_MAC if mac else 0
        handshake_s = min(handshake_timeout_s, connect_timeout_s)
        self._dialer = Dialer(
            rank, world_size, job, token, epoch, flags, connect_timeout_s, handshake_s
        )
        #: every rank's address, by rank; read only to dial a peer (it may fetch it then)
        self.peers: Sequence[str] = []
        self.socks: dict[int, socket.socket] = {}
        self.sessions: dict[int, LinkMac] = {}
        #: peers whose link broke or was closed in this epoch: never linked again in it
        self.dropped: set[int] = set()
        #: messages started to and received whole from each peer in this epoch (a resume's
        #: cursors), and the links to each that were resumed
        self.started = [0] * world_size
        self.received = [0] * world_size
        self.resumed = [0] * world_size
        #: peer -> (message index, first byte, its bytes from there): the unacknowledged
        #: end of the last large message sent whole to it on a plain link, for a resume (a
        #: copy, or a view of a call's settled memory: ``step_resume.keep_tails``)
        self.tails: dict[int, tuple[int, int, list[memoryview]]] = {}
        #: new links from linked peers (their side of the link broke), for a resume to take
        self._fresh: dict[int, tuple[socket.socket, LinkMac | None]] = {}
        self._flows: dict[int, Flow] = {}  # peer -> what moves on its link (made on first use)
        self.refusals = RefusalLog(rank)  # handshakes refused since the links opened
        self._linked = threading.Condition()
        self._dialing = threading.Lock()  # a send and a recv on two threads share a link
        self._closed = threading.Event()
        self._listener = listen(host, rank, world_size)
        self.address = "{}:{}".format(*self._listener.getsockname())
        self._acceptor = self._start_accepting(handshake_s)

    def _start_accepting(self, handshake_s: float) -> threading.Thread:
        """The thread that answers every newcomer's handshake and files the proven ones."""
        dialer = self._dialer
        acceptor = Acceptor(
            self._listener,
            rank=self.rank,
            link=(dialer.token, dialer.job, dialer.epoch, self.world_size, dialer.flags),
            deadline_s=handshake_s,
            slots=MAX_PENDING_HANDSHAKES,
            admit=self._admit,
            refusals=self.refusals,
            closed=self._closed,
        )
        thread = threading.Thread(
            target=acceptor.run, name=f"cclctl-links-r{self.rank}", daemon=True
        )
        thread.start()
        return thread

    @property
    def auth_failures(self) -> int:
        """Handshakes refused since the links opened (the telemetry's count)."""
        return self.refusals.total

    def get(self, peer: int, call: Call, wait: Wait) -> socket.socket:
        sock = self.socks.get(peer)
        if sock is None and peer in self.dropped:
            # A link closed in this epoch stays closed: the peer may not know yet (a link it
            # is not using), and waiting for it to connect again would hang both; the
            # failure spreads instead, and a retry opens new links of the next epoch.
            what = f"the link to rank {peer} was closed earlier in this epoch"
            raise self._peer_error(peer, call, what)
        if sock is None and self.rank < peer:
            with self._dialing:  # one dial per link, whichever thread needs it first
                sock = self.socks.get(peer) or self._connect(peer, call, wait)
        elif sock is None:
            sock = self._accept(peer, call, wait)
        return sock

    def flow(self, peer: int) -> Flow:
        """The link to ``peer``'s lock and what its steps move on it (:mod:`.flow`)."""
        found = self._flows.get(peer)
        return found if found is not None else self._flows.setdefault(peer, Flow())

    def session(self, peer: int) -> LinkMac | None:
        """The link's MAC session; None when messages carry no MAC."""
        return self.sessions.get(peer)

    def _connect(self, peer: int, call: Call, wait: Wait) -> socket.socket:
        try:
            where = self.peers[peer]
        except CclError as exc:  # an address fetched on first use that never came
            raise self._peer_error(peer, call, f"no address of rank {peer}: {exc}") from None
        sock, session = self._dialer.first(peer, where, call, wait)
        self._keep(peer, sock, session)
        return sock

    def _peer_error(self, peer: int, call: Call, what: str) -> PeerError:
        return peer_error(self.rank, peer, call, what)

    def _accept(self, peer: int, call: Call, wait: Wait) -> socket.socket:
        """Wait until the accept thread has linked ``peer``, checking the call's deadline."""
        wait.blocked_on(peer, "recv")
        with self._linked:
            while peer not in self.socks:
                left = wait.check(call, peer, "recv")
                self._linked.wait(min(left, 0.5))
            return self.socks[peer]

    def has_fresh(self, peer: int | None = None) -> bool:
        """``peer`` (any peer: None) linked again while its old link is still here: that
        one is dead."""
        return bool(self._fresh) if peer is None else peer in self._fresh

    def reopen(
        self, peer: int, call: Call, wait: Wait, deadline: float, gone: Callable[[], bool]
    ) -> socket.socket:
        """A new link to ``peer`` in place of one that a reset broke (closed here): the lower
        rank connects again until ``deadline``, the higher one takes what its accept thread
        files. Raises OSError at once where ``peer`` refuses connections (its links are
        gone) or ``gone()`` (its process is), or :class:`HandshakeRefused` when it turns
        the new link away."""
        with self._linked:
            old = self.socks.pop(peer, None)
            self.sessions.pop(peer, None)
            fresh = self._fresh.pop(peer, None)
            if fresh is not None:
                self._file(peer, *fresh)
        if old is not None:
            old.close()
        if self.rank < peer:
            sock, session = self._dialer.again(peer, self.peers[peer], call, wait, deadline)
            self._keep(peer, sock, session)
            return sock
        wait.blocked_on(peer, "recv")
        with self._linked:
            while peer not in self.socks:
                wait.check(call, peer, "recv")
                if gone():
                    raise OSError(errno.ESRCH, f"rank {peer}'s process is gone")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OSError(errno.ETIMEDOUT, f"rank {peer} did not link again in time")
                self._linked.wait(min(left, _RELINK_LOOK_S))
            return self.socks[peer]

    def _admit(self, sock: socket.socket, ctx: LinkContext) -> None:
        """File a link whose connector proved the token (the accept thread calls this);
        raises :class:`HandshakeRefused` where this rank may not link it."""
        claimed = ctx.connector
        with self._linked:
            if self._closed.is_set():
                raise HandshakeRefused(link_auth.KINDS["closing"], claimed, "closing")
            if claimed in self.dropped:
                why = link_auth.KINDS["closed_in_epoch"]
                raise HandshakeRefused(why, claimed, "closed_in_epoch")
            if claimed in self.socks and not self.resume_s:
                raise HandshakeRefused(link_auth.KINDS["already_linked"], claimed, "already_linked")
            sock.sendall(link_auth.confirmation(self._dialer.token, ctx))  # 36 bytes: never blocks
            session = ctx.session(self._dialer.token, self.rank)
            if claimed in self.socks:  # its side broke: kept for this side's resume
                prepare(sock, self.stall_ms)
                stale = self._fresh.pop(claimed, None)
                if stale is not None:
                    stale[0].close()
                self._fresh[claimed] = (sock, session)
            else:
                self._keep(claimed, sock, session)
            self._linked.notify_all()

    def _keep(self, peer: int, sock: socket.socket, session: LinkMac | None) -> None:
        prepare(sock, self.stall_ms)
        self._file(peer, sock, session)

    def _file(self, peer: int, sock: socket.socket, session: LinkMac | None) -> None:
        if session is not None:
            self.sessions[peer] = session
        self.socks[peer] = sock

    def drop(self, peer: int) -> None:
        with self._linked:
            self.dropped.add(peer)
            self.sessions.pop(peer, None)
            sock = self.socks.pop(peer, None)
            fresh = self._fresh.pop(peer, None)
        for s in (sock, fresh[0] if fresh else None):
            if s is not None:
                s.close()

    def open_links(self) -> list[tuple[int, socket.socket]]:
        with self._linked:
            return list(self.socks.items())

    def drop_all(self) -> None:
        """Close every link (a failure: what is on them can no longer be trusted); the
        listener stays, so a later close is the same as ever."""
        with self._linked:
            socks = [*self.socks.values(), *(s for s, _ in self._fresh.values())]
            self.dropped.update(self.socks)
            self.dropped.update(self._fresh)
            self.socks.clear()
            self.sessions.clear()
            self._fresh.clear()
        for sock in socks:
            sock.close()

    def close(self) -> None:
        self._closed.set()
        with self._linked:
            for sock in [*self.socks.values(), *(s for s, _ in self._fresh.values())]:
                sock.close()
            self.socks.clear()
            self.sessions.clear()
            self._fresh.clear()
        with contextlib.suppress(OSError):  # wakes the accept thread at once
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if self._acceptor is not threading.current_thread():
            self._acceptor.join(2 * POLL_S + 1.0)
        self.refusals.close()
