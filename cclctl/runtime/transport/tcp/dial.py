"""Dialing a peer: the lower rank of a pair connects to the higher one and proves the token.

A first link is tried again until the connect deadline where nothing listens yet or the peer
had no handshake slot free; a link that a reset broke is dialed again until the resume's
deadline (:mod:`~.resume`). :class:`~.links.Links` files what a dial returns.
"""

from __future__ import annotations

import dataclasses
import errno
import socket
import time

from cclctl.errors import PeerError
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp import link_auth
from cclctl.runtime.transport.tcp.link_auth import HandshakeRefused
from cclctl.runtime.transport.tcp.mac import LinkMac
from cclctl.runtime.transport.wire import Call

_RELINK_LOOK_S = 0.05  # how often a link dialed again retries
#: a peer's refusals that mean "not now" (no handshake slot free, closing): dial again
_NOT_NOW = ("evicted", "closed")

Dialed = tuple[socket.socket, LinkMac | None]


def peer_error(rank: int, peer: int, call: Call, what: str) -> PeerError:
    """The error a step raises when its link to ``peer`` cannot be made."""
    return PeerError(f"rank {rank}: {what}", rank=rank, peer=peer, seq=call.seq, op=call.op)


def _address(where: str) -> tuple[str, int]:
    host, _, port = where.rpartition(":")
    return host, int(port)


@dataclasses.dataclass(frozen=True, slots=True)
class Dialer:
    """What this rank proves when it connects: the job, its token, the epoch, the options."""

    rank: int
    world_size: int
    job: str
    token: str
    epoch: int
    flags: int
    connect_timeout_s: float
    handshake_s: float

    def _handshake(self, sock: socket.socket, peer: int) -> LinkMac | None:
        return link_auth.connect(
            sock, self.token, self.job, self.epoch, self.rank, peer, self.world_size, self.flags
        )

    def first(self, peer: int, where: str, call: Call, wait: Wait) -> Dialed:
        """Link to ``peer`` until the connect deadline: again where nothing listens yet, or
        where the peer turned the link away for want of a handshake slot (a flood on its
        port) or closed it without a word; at once where it refused it for a reason."""
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            # one try never outlives the call's own deadline (a probe's -T): a peer behind a
            # firewall that drops packets fails the call at its deadline, not a try's later
            left = max(0.05, min(deadline, wait.deadline) - time.monotonic())
            try:
                sock = socket.create_connection(_address(where), timeout=min(left, 5.0))
            except OSError as exc:
                what = f"cannot connect to rank {peer} at {where}: {exc}"
                self._before_again(peer, call, wait, deadline, what)
                continue
            try:
                left = max(0.05, min(deadline, wait.deadline) - time.monotonic())
                sock.settimeout(min(self.handshake_s, left))
                return sock, self._handshake(sock, peer)
            except (HandshakeRefused, OSError) as exc:
                sock.close()
                why = exc.why if isinstance(exc, HandshakeRefused) else str(exc) or "timed out"
                what = f"the link handshake with rank {peer} at {where} failed: {why}"
                if isinstance(exc, HandshakeRefused) and exc.kind in _NOT_NOW:
                    self._before_again(peer, call, wait, deadline, what)
                    continue
                raise peer_error(self.rank, peer, call, what) from None

    def _before_again(self, peer: int, call: Call, wait: Wait, deadline: float, what: str) -> None:
        """Between two tries to link to ``peer``: fail with ``what`` past the deadline."""
        wait.blocked_on(peer, "send")
        wait.check(call, peer, "send")
        if time.monotonic() > deadline:
            raise peer_error(self.rank, peer, call, what)
        time.sleep(0.05)

    def again(self, peer: int, where: str, call: Call, wait: Wait, deadline: float) -> Dialed:
        """A new link to ``peer`` in place of one a reset broke, until ``deadline``. Raises
        ConnectionRefusedError at once (nothing listens: the peer's links of this epoch are
        gone), OSError past the deadline, :class:`HandshakeRefused` for a reason."""
        wait.blocked_on(peer, "send")
        while True:
            wait.check(call, peer, "send")
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(errno.ETIMEDOUT, f"could not link to rank {peer} again in time")
            try:
                sock = socket.create_connection(_address(where), timeout=min(left, 1.0))
            except ConnectionRefusedError:
                raise  # nothing listens there: the peer's links of this epoch are gone
            except OSError:
                time.sleep(min(_RELINK_LOOK_S, left))
                continue
            try:
                sock.settimeout(max(0.05, min(left, self.handshake_s)))
                return sock, self._handshake(sock, peer)
            except OSError:
                sock.close()
            except HandshakeRefused as exc:
                sock.close()
                if exc.kind not in _NOT_NOW:
                    raise
                time.sleep(min(_RELINK_LOOK_S, max(0.0, deadline - time.monotonic())))
