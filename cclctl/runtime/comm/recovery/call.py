"""One call of a collective as a value: what the job asked for, run one attempt at a time.

A recovery policy gets a :class:`Call` and decides how often and how to run it
(:meth:`Call.attempt`, each time on the communicator's current
:class:`~cclctl.runtime.comm.collectives.Collectives`), so the communicator's public ops
are one line each and no policy knows each op's signature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from cclctl.runtime.comm.collectives import Collectives
    from cclctl.runtime.comm.ending import Ending

Array = np.ndarray

#: The calls whose attempt takes an ending (``rerun.Ending``: a retry's confirm).
ENDED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


# A value (never assigned once made), yet not a frozen dataclass: every call of the
# communicator makes one, and a frozen dataclass' __init__ (each field through
# object.__setattr__) costs about four times a plain slotted one's.
@dataclasses.dataclass(slots=True)
class Call:
    """``op`` on ``buf`` (into ``out``), with its reduction ``redop``, its ``root`` and its
    point-to-point ``peer`` where the op has them; ``views``: ``buf``'s and ``out``'s flat
    views where a policy checked them already (an all_reduce's, once for all its attempts:
    :meth:`with_views`)."""

    op: str
    buf: Array
    out: Array | None = None
    redop: str = "sum"
    root: int = 0
    peer: int = 0
    views: tuple[Array, Array] | None = None
    counts: tuple[Sequence[int], Sequence[int]] | None = None  # all_to_allv's, sent and received

    @classmethod
    def all_reduce(cls, buf: Array, op: str = "sum", out: Array | None = None) -> Call:
        return cls("all_reduce", buf, out, redop=op)

    @classmethod
    def all_gather(cls, buf: Array, out: Array) -> Call:
        return cls("all_gather", buf, out)

    @classmethod
    def reduce_scatter(cls, buf: Array, out: Array, op: str = "sum") -> Call:
        return cls("reduce_scatter", buf, out, redop=op)

    @classmethod
    def broadcast(cls, buf: Array, root: int = 0, out: Array | None = None) -> Call:
        return cls("broadcast", buf, out, root=root)

    @classmethod
    def reduce(cls, buf: Array, op: str = "sum", root: int = 0, out: Array | None = None) -> Call:
        return cls("reduce", buf, out, redop=op, root=root)

    @classmethod
    def all_to_all(cls, buf: Array, out: Array) -> Call:
        return cls("all_to_all", buf, out)

    @classmethod
    def all_to_allv(
        cls, buf: Array, out: Array, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> Call:
        return cls("all_to_allv", buf, out, counts=(send_counts, recv_counts))

    @classmethod
    def barrier(cls) -> Call:
        return cls("barrier", np.zeros(1, dtype=np.uint8))

    @classmethod
    def send(cls, buf: Array, dst: int) -> Call:
        return cls("send", buf, peer=dst)

    @classmethod
    def recv(cls, buf: Array, src: int) -> Call:
        return cls("recv", buf, peer=src)

    def with_buffers(self, buf: Array, out: Array | None) -> Call:
        """The same call on other buffers (a replay from a kept input, its result dropped)."""
        return dataclasses.replace(self, buf=buf, out=out, views=None)

    def with_views(self, src: Array, dst: Array) -> Call:
        """The same all_reduce with its arguments checked (``src`` and ``dst``, what
        :func:`~cclctl.runtime.comm.buffers.reduce_args` gave): no attempt checks again."""
        assert self.op == "all_reduce", self.op
        return Call(self.op, self.buf, self.out, self.redop, self.root, self.peer, (src, dst))

    def with_root(self, root: int) -> Call:
        """The same call from another root (the root's rank after a shrink renumbered, or
        its index checked); itself where that is its root (every broadcast's first try)."""
        if root == self.root:
            return self
        return Call(
            self.op, self.buf, self.out, self.redop, root, self.peer, self.views, self.counts
        )

    def attempt(self, run: Collectives, ending: Ending | None = None) -> Any:
        """Run the call once on ``run``; ``ending`` is called in its step once its result is
        whole (only the ops of :data:`ENDED` take one)."""
        assert ending is None or self.op in ENDED, self.op
        once = _ATTEMPTS.get(self.op)
        if once is None:
            raise ValueError(f"unknown collective {self.op!r}")
        return once(run, self, ending)

    @property
    def sent_received(self) -> tuple[Sequence[int], Sequence[int]]:
        """``counts``, for the op that must have them."""
        assert self.counts is not None, self.op
        return self.counts

    @property
    def into(self) -> Array:
        """``out``, for the ops that must have one."""
        assert self.out is not None, self.op
        return self.out


#: How each op runs once: ``(run, call, ending) -> result``.
_ATTEMPTS: dict[str, Callable[[Collectives, Call, Ending | None], Any]] = {
    "all_reduce": lambda run, c, e: run.all_reduce(c.buf, c.redop, c.out, e, c.views),
    "all_gather": lambda run, c, e: run.all_gather(c.buf, c.into, e),
    "reduce_scatter": lambda run, c, e: run.reduce_scatter(c.buf, c.into, c.redop, e),
    "broadcast": lambda run, c, e: run.broadcast(c.buf, c.root, c.out, e),
    "reduce": lambda run, c, e: run.reduce(c.buf, c.redop, c.root, c.out),
    "all_to_all": lambda run, c, e: run.all_to_all(c.buf, c.into),
    "all_to_allv": lambda run, c, e: run.all_to_allv(c.buf, c.into, *c.sent_received),
    "barrier": lambda run, c, e: run.barrier(),
    "send": lambda run, c, e: run.send(c.buf, c.peer),
    "recv": lambda run, c, e: run.recv(c.buf, c.peer),
}
