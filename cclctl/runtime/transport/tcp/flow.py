"""What moves on one link each way, whichever steps move it, for a resume to see both ways.

A step's transfers on a link are at most one send to the peer and at most one receive from
it. A collective's step has both; the torch backend's point-to-point lanes run a send and a
receive with one peer in two steps on two threads at once. A reset's resume
(:mod:`~cclctl.runtime.transport.tcp.resume`) agrees with the peer on both ways in one
exchange of cursors and moves both on to the new connection, so whichever step finds the
link broken must see, and move, the other step's transfer too. Each transfer's moves on
the socket and each resume of the link run under the link's :attr:`Flow.lock`, so no
thread is ever mid-call on a socket that a resume on another thread replaces.
"""

from __future__ import annotations

import dataclasses
import threading

from cclctl.runtime.transport.tcp.messages import Recv, Send


@dataclasses.dataclass(slots=True)
class Outgoing:
    """A step's message to the peer: its item and what it sends again after a reset (the
    caller's buffer stays untouched until the step ends)."""

    owner: object  # the step that sends it
    item: Send
    index: int  # the message's index on the link
    header: bytes
    view: memoryview


@dataclasses.dataclass(slots=True)
class Incoming:
    """A step's receive from the peer."""

    owner: object
    item: Recv


class Flow:
    """One link's lock and what its live steps move on it: set as a step starts, cleared
    as it ends."""

    __slots__ = ("lock", "recv", "send")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.send: Outgoing | None = None
        self.recv: Incoming | None = None

    def release(self, owner: object) -> None:
        """``owner``'s step ended: its transfers are no longer this link's to resume."""
        if self.send is not None and self.send.owner is owner:
            self.send = None
        if self.recv is not None and self.recv.owner is owner:
            self.recv = None
