"""The TCP transport: one link per pair of ranks that talk, a :class:`~.step.TcpStep` per step.

Links are made on a step's first use of them (:mod:`~.links`); the transport counts each
peer's bytes and, when the communicator fails or closes, tells its peers on every link.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

from cclctl.revocation import Revocation
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Transfer, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT
from cclctl.runtime.transport.drive import DrivenAlone
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.messages import Send
from cclctl.runtime.transport.tcp.step import TcpStep


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
        #: each thread that ran a step (the torch backend's lanes: several) -> its last one
        self._live: dict[int, TcpStep] = {}
        self._revoked = False

    @property
    def address(self) -> str:
        return self._links.address

    def set_peers(self, addresses: Sequence[str]) -> None:
        """Every rank's address, by rank; kept as given (a lazy sequence fetches an address
        on its first read, when this rank dials that peer)."""
        self._links.peers = addresses

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
        links = self._links
        outgoing: dict[int, tuple[int, bytes, memoryview]] = {}
        incoming: dict[int, memoryview] = {}
        for peer, view in sends:
            links.get(peer, call, wait)
            outgoing[peer] = (links.started[peer], wire.pack(call, step, len(view)), view)
            links.started[peer] += 1
            self._sent[peer] += len(view)
        for peer, view in recvs:
            links.get(peer, call, wait)
            incoming[peer] = view
            self._received[peer] += len(view)
        self._step = step_ = TcpStep(links, call, step, wait, outgoing, incoming)
        self._live[self._owner] = step_
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
        no frame (it would carry none), nor does any link while another thread's step is in
        flight (it may be mid-message on it): their peers hear of it through the store."""
        if self._revoked or threading.get_ident() != self._owner:
            return
        self._revoked = True
        links = self._links
        busy = self._mid_message()
        alone = all(s.done for t, s in self._live.items() if t != self._owner)
        frame = b""
        if revocation is not None and status == "broken" and alone:
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
