"""The interface between algorithms and the wires that move their bytes.

Algorithms describe each step of a collective as a set of sends and receives between this
rank and its peers; a transport completes the whole set, in any order, without deadlock.
That one call is enough for rings, trees, recursive doubling and pairwise exchanges, and it
lets a shared-memory transport slot in beside TCP without touching the algorithms.

Underneath, TCP and shared memory hand out a step as a :class:`Progress` (moved without
blocking, waited on when stuck: :class:`SteppedTransport`), so one loop
(:mod:`cclctl.runtime.transport.drive`) runs a step over one transport or over several at
once (the hybrid transport).

Beside the steps, a transport may offer a hook that one other part of the runtime asks for,
each a small Protocol of its own: :class:`LinkCutter` (fault injection), :class:`LinkCounters`
(telemetry) and :class:`PeerAnnouncer` (the failure state). TCP, shared memory and the hybrid
offer all three; a transport without one simply goes without what it gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cclctl.revocation import Revocation
from cclctl.runtime.failure import Announce
from cclctl.runtime.transport.capabilities import Capabilities
from cclctl.runtime.transport.wait import Transfer, Wait
from cclctl.runtime.transport.wire import Call

__all__ = [
    "Exchanger",
    "LinkCounters",
    "LinkCutter",
    "PeerAnnouncer",
    "Progress",
    "SteppedTransport",
    "Transfer",
    "Transport",
    "Wait",
    "announcer",
]


class Progress(Protocol):
    """One transport's share of a step in flight: moved without blocking, waited on when stuck."""

    @property
    def done(self) -> bool:
        """True once every transfer of the share has completed."""
        ...

    def advance(self) -> bool:
        """Move every transfer that can move now, without blocking; True if any moved."""
        ...

    def waiting_on(self) -> tuple[int, str]:
        """The peer and direction (``"recv"`` first, else ``"send"``) a stuck share waits on."""
        ...

    def check(self) -> None:
        """Raise now if a peer of the share failed or died (without blocking)."""
        ...

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        """Wait until a transfer can move, at most ``slice_s`` seconds (None: the transport's
        own bound); raise through ``wait.check(call, peer, what)`` or on a failed peer."""
        ...


class Exchanger(Protocol):
    """Moves the bytes of one algorithm step between this rank and its peers: all that
    algorithms see of a transport."""

    name: str
    capabilities: Capabilities  # the engines beside point-to-point steps (selection reads it)

    def exchange(
        self,
        call: Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:
        """Send and receive every transfer of ``step``; at most one each way per peer.

        Every message is preceded by a header naming ``call`` and ``step``; a received
        header that does not match raises :class:`~cclctl.errors.ProtocolError`.
        """
        ...


class Transport(Exchanger, Protocol):
    """A transport as a rank's communicator holds it: the steps algorithms run (the
    :class:`Exchanger` they see) and its close. What else a transport can do is a
    capability of its own below, asked for by the one part that needs it."""

    def close(self) -> None: ...


@runtime_checkable
class LinkCutter(Protocol):
    """Fault injection's hold on a transport (``CCLCTL_FAULT=link:...``): only a fault plan
    that names a link fault asks for it (``runtime/comm/faults.py``)."""

    def drop_link(self, peer: int) -> None:
        """Close the link to ``peer`` (the next use fails, or a retry renews the links)."""
        ...


@runtime_checkable
class LinkCounters(Protocol):
    """Telemetry's view of a transport: the bytes moved with each peer
    (``runtime/job/link_telemetry.py``; a transport without it has no link series)."""

    def link_bytes(self) -> tuple[list[int], list[int]]:
        """Bytes sent to and received from each peer so far (indexed by rank)."""
        ...


@runtime_checkable
class PeerAnnouncer(Protocol):
    """The failure state's hook on a transport: how a failure or a close reaches peers
    (a transport without it leaves that to the job's store)."""

    def announce(self, status: str, revocation: Revocation | None) -> None:
        """Tell this rank's peers it is ``broken`` (why: ``revocation``) or ``closed`` by
        the transport's own means (shared memory: this rank's revoke area and state word;
        TCP: a revoke frame on every link, then the close)."""
        ...


def announcer(transport: Transport) -> Announce | None:
    """``transport``'s hook for the failure state (None: it has none)."""
    return transport.announce if isinstance(transport, PeerAnnouncer) else None


class SteppedTransport(Transport, Protocol):
    """A transport whose steps can also be driven together with another's (the hybrid)."""

    def start(
        self,
        call: Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> Progress:
        """The transfers of ``step`` as a share not yet moved (links are set up here)."""
        ...
