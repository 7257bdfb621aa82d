"""The communicator: the collectives a job calls, and what a failure of one then does.

Each public call runs one attempt of its collective (:class:`~cclctl.runtime.comm.
collectives.Collectives`), or, where the job asked for it, goes through the policy that
rides a failure out: ``CCLCTL_RETRY_BUDGET`` re-runs a call a link fault interrupted
(:mod:`~cclctl.runtime.comm.retrying`), ``CCLCTL_ON_FAILURE=shrink`` drops a dead rank
and re-runs among the survivors (:mod:`~cclctl.runtime.comm.shrinking`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.errors import CommError
from cclctl.runtime.comm import rerun, retrying, shrinking
from cclctl.runtime.comm.collectives import Collectives
from cclctl.runtime.comm.tracing import Tracer
from cclctl.runtime.transport.base import Transport

Array = np.ndarray


def world_comm_id(world_size: int) -> str:
    """The world communicator's id: creation index 0 and its member ranks."""
    return f"0:0-{world_size - 1}" if world_size > 1 else "0:0"


class Communicator(Collectives):
    """A group of ranks that run collectives together."""

    backend = "cclctl"

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        transport: Transport,
        cfg: RuntimeConfig,
        comm_id: str,
        tracer: Tracer | None = None,
        on_close: Callable[[], None] | None = None,
        watchdog: bool = False,
        members: Sequence[int] | None = None,
        shrinker: shrinking.Shrinker | None = None,
        retrier: retrying.Retrier | None = None,
    ) -> None:
        """``watchdog``: a watchdog thread expires hung calls (through :attr:`failure`).
        ``members``: each rank's global rank; ``shrinker`` builds :meth:`shrink`'s result;
        ``retrier`` renews the links after a link fault (``CCLCTL_RETRY_BUDGET``)."""
        super().__init__(
            rank=rank, world_size=world_size, transport=transport, cfg=cfg, comm_id=comm_id,
            tracer=tracer, watchdog=watchdog, members=members,
        )  # fmt: skip
        #: how the survivors agreed on this communicator (None: it is not a shrink's)
        self.shrink_info: shrinking.ShrinkInfo | None = None
        self._shrinker = shrinker
        self._shrink_callbacks: list[shrinking.OnShrink] = []
        #: what this rank kept of its completed calls, for ranks a fault leaves behind
        self._kept = rerun.Kept()
        #: the last retry's plan: the calls a rank behind takes from the ranks ahead
        self._catchup: retrying.Plan | None = None
        #: a call's retry failed here: its close serves no retry
        self._retry_gave_up = False
        self._retrier = retrier
        self._on_close = on_close

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, buf: Array, op: str = "sum", out: Array | None = None) -> Array:
        if self._shrinks():
            return shrinking.all_reduce(self, buf, op, out)
        if self._retries():
            return retrying.all_reduce(self, buf, op, out)
        return self._all_reduce(buf, op, out)

    def all_gather(self, buf: Array, out: Array) -> Array:
        if self._retries():
            return retrying.all_gather(self, buf, out)
        return self._all_gather(buf, out)

    def reduce_scatter(self, buf: Array, out: Array, op: str = "sum") -> Array:
        if self._retries():
            return retrying.reduce_scatter(self, buf, out, op)
        return self._reduce_scatter(buf, out, op)

    def broadcast(self, buf: Array, root: int = 0, out: Array | None = None) -> Array:
        if self._retries():
            return retrying.broadcast(self, buf, root, out)
        return self._broadcast(buf, root, out)

    def reduce(self, buf: Array, op: str = "sum", root: int = 0, out: Array | None = None) -> Array:
        if self._retries():
            return retrying.reduce(self, buf, op, root, out)
        return self._reduce(buf, op, root, out)

    def all_to_all(self, buf: Array, out: Array) -> Array:
        if self._retries():
            return retrying.all_to_all(self, buf, out)
        return self._all_to_all(buf, out)

    def barrier(self) -> None:
        if self._shrinks():
            return shrinking.barrier(self)
        if self._retries():
            return retrying.barrier(self)
        return self._barrier()

    def send(self, buf: Array, dst: int) -> None:
        if self._retries():
            return retrying.not_rerun(self, "send", lambda: self._send(buf, dst))
        return self._send(buf, dst)

    def recv(self, buf: Array, src: int) -> Array:
        if self._retries():
            return retrying.not_rerun(self, "recv", lambda: self._recv(buf, src))
        return self._recv(buf, src)

    def _shrinks(self) -> bool:
        """``CCLCTL_ON_FAILURE=shrink`` is on: a dead rank is shrunk away (and retry is off)."""
        return self.cfg.on_failure == "shrink" and self._shrinker is not None

    def _retries(self) -> bool:
        """A link fault is ridden through (:mod:`~cclctl.runtime.comm.retrying`)."""
        return self._retrier is not None and not self._shrinks() and retrying.enabled(self)

    # ----------------------------------------------------------------- lifecycle
    def shrink(
        self, exclude: Collection[int] = (), timeout_s: float | None = None, *, call: str = ""
    ) -> Communicator:
        """The live ranks' communicator, renumbered in order; this one is closed, never
        waiting on the dead (``docs/fault-tolerance.md``; ``call``: the interrupted one)."""
        if self._shrinker is None:
            raise CommError(f"rank {self.rank}: {self.id} was not made by cclctl.init()")
        return self._shrinker(self, frozenset(exclude), timeout_s, call)

    def on_shrink(self, callback: shrinking.OnShrink) -> None:
        """``callback(comm, excluded)`` after each automatic shrink, before the re-run."""
        self._shrink_callbacks.append(callback)

    def release(self) -> None:
        """Close the calls and the transport, not the job (a shrink hands the job on)."""
        if self._calls.failure.close():
            self.transport.close()

    def abort(self, reason: str) -> None:
        """Make every blocked or future call on this communicator fail with ``reason``."""
        self._calls.failure.abort(reason)

    def close(self) -> None:
        """Refuse every later call, tell the peers and close the links (idempotent). With
        retry on, first wait (up to the budget) for every rank to close, serving a retry
        that ranks behind need meanwhile (:func:`~.retrying.closing`)."""
        if self._calls.failure.closed:
            return
        if self._retries():
            retrying.closing(self)  # ranks behind may still need this rank's kept calls
        if not self._calls.failure.close():
            return
        self.transport.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Communicator {self.id} rank {self.rank}/{self.world_size} {self.transport.name}>"
