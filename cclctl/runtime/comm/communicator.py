"""The communicator: the collectives a job calls, and what a failure of one then does.

Each public call is a :class:`~cclctl.runtime.comm.recovery.call.Call` handed to the
communicator's recovery policy (:mod:`cclctl.runtime.comm.recovery`), chosen once from the
configuration: raise (the default), ``CCLCTL_RETRY_BUDGET`` (re-run a call a link fault
interrupted) or ``CCLCTL_ON_FAILURE=shrink`` (drop a dead rank and re-run among the
survivors). The policy runs attempts on the communicator's current
:class:`~cclctl.runtime.comm.collectives.Collectives` through the communicator's narrow
side for it (:class:`~cclctl.runtime.comm.recovery.port.Port`); a shrink in place swaps
that state for the survivors', the object the job holds staying the same.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.errors import CommError
from cclctl.runtime.comm import recovery
from cclctl.runtime.comm.collectives import Collectives, Ending
from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.retry_rules import Retrier
from cclctl.runtime.comm.recovery.shrink_rules import ShrinkInfo
from cclctl.runtime.comm.rerun import Kept
from cclctl.runtime.comm.tracing import Tracer
from cclctl.runtime.failure import FailureState
from cclctl.runtime.identity import UNKNOWN, RankIdentity
from cclctl.runtime.transport.base import Transport
from cclctl.runtime.transport.shm import shared_buffers

Array = np.ndarray
#: ``shrink(comm, exclude, timeout_s, call)``: the job's way of building the survivors'
#: communicator (:mod:`cclctl.runtime.job.survivors`); ``call`` names the interrupted call.
Shrinker = Callable[["Communicator", "frozenset[int]", "float | None", str], "Communicator"]
#: ``callback(comm, excluded)``: told after an automatic shrink (``excluded``: global ranks).
OnShrink = Callable[["Communicator", "list[int]"], None]


def world_comm_id(world_size: int) -> str:
    """The world communicator's id: creation index 0 and its member ranks."""
    return f"0:0-{world_size - 1}" if world_size > 1 else "0:0"


class Communicator:
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
        shrinker: Shrinker | None = None,
        retrier: Retrier | None = None,
        identity: RankIdentity = UNKNOWN,
    ) -> None:
        """``watchdog``: a watchdog thread expires hung calls (through :attr:`failure`).
        ``members``: each rank's global rank; ``shrinker`` builds :meth:`shrink`'s result;
        ``retrier`` renews the links after a link fault (``CCLCTL_RETRY_BUDGET``);
        ``identity``: this rank's host and evidence, every job rank's process (its failures
        name them)."""
        #: the ranks, links and calls that run each attempt (a shrink in place swaps it)
        self._run = Collectives(
            rank=rank, world_size=world_size, transport=transport, cfg=cfg, comm_id=comm_id,
            tracer=tracer, watchdog=watchdog, members=members, identity=identity,
        )  # fmt: skip
        #: how the survivors agreed on this communicator (None: it is not a shrink's)
        self.shrink_info: ShrinkInfo | None = None
        #: what this rank kept of its completed calls, for ranks a fault leaves behind
        self._kept = Kept()
        self._shrinker = shrinker
        self._shrink_callbacks: list[OnShrink] = []
        self._on_close = on_close
        shrinks = cfg.on_failure == "shrink" and shrinker is not None
        self._recovery = recovery.choose(self, shrinks=shrinks, retrier=retrier)

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, buf: Array, op: str = "sum", out: Array | None = None) -> Array:
        return self._recovery.run(Call.all_reduce(buf, op, out))

    def all_gather(self, buf: Array, out: Array) -> Array:
        return self._recovery.run(Call.all_gather(buf, out))

    def reduce_scatter(self, buf: Array, out: Array, op: str = "sum") -> Array:
        return self._recovery.run(Call.reduce_scatter(buf, out, op))

    def broadcast(self, buf: Array, root: int = 0, out: Array | None = None) -> Array:
        return self._recovery.run(Call.broadcast(buf, root, out))

    def reduce(self, buf: Array, op: str = "sum", root: int = 0, out: Array | None = None) -> Array:
        return self._recovery.run(Call.reduce(buf, op, root, out))

    def all_to_all(self, buf: Array, out: Array) -> Array:
        return self._recovery.run(Call.all_to_all(buf, out))

    def all_to_allv(
        self, buf: Array, out: Array, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> Array:
        """all_to_all of blocks of any sizes: ``send_counts[i]`` elements of ``buf`` (its
        blocks end to end, in rank order) go to rank ``i``, and ``recv_counts[i]`` elements
        from rank ``i`` land in ``out`` in the same way. Rank ``i``'s ``send_counts[j]``
        must equal rank ``j``'s ``recv_counts[i]``: where they differ the call fails
        naming the pair."""
        return self._recovery.run(Call.all_to_allv(buf, out, send_counts, recv_counts))

    def barrier(self) -> None:
        self._recovery.run(Call.barrier())

    def send(self, buf: Array, dst: int) -> None:
        self._recovery.run(Call.send(buf, dst))

    def recv(self, buf: Array, src: int) -> Array:
        return self._recovery.run(Call.recv(buf, src))

    # ----------------------------------------------------------------- who it is
    @property
    def rank(self) -> int:
        return self._run.rank

    @property
    def world_size(self) -> int:
        return self._run.world_size

    @property
    def members(self) -> list[int]:
        """Each rank's rank in the job."""
        return self._run.members

    @property
    def id(self) -> str:
        return self._run.id

    @property
    def cfg(self) -> RuntimeConfig:
        return self._run.cfg

    @property
    def transport(self) -> Transport:
        return self._run.transport

    @property
    def failure(self) -> FailureState:
        """Whether calls may run here and, once not, the first failure's origin."""
        return self._run.failure

    @property
    def tracer(self) -> Tracer | None:
        """Telemetry that sees every call (None: calls are not recorded)."""
        return self._run.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        self._run.tracer = tracer

    def empty(self, shape: Any, dtype: Any = np.float32) -> Array:
        """A new, uninitialised array that ranks on this host read directly.

        Collectives whose buffers come from here on every rank of a one-host communicator
        run zero-copy (nothing is staged through shared-memory slots): about 2-3x the
        bandwidth from a few MiB up. Pass such buffers on every rank or on none: a mix is a
        collective mismatch. Allocate them once and reuse them (e.g. as staging buffers);
        each lives as long as any array that views it.
        """
        return shared_buffers.empty(shape, dtype)

    def zeros(self, shape: Any, dtype: Any = np.float32) -> Array:
        """As :meth:`empty`, zeroed (free: new shared memory starts zero-filled)."""
        return shared_buffers.zeros(shape, dtype)

    # ----------------------------------------------------------------- the recovery port
    @property
    def completed(self) -> int:
        """The seq of the last collective call completed here."""
        return self._run.calls.completed

    @property
    def kept(self) -> Kept:
        """What this rank kept of its completed calls, for ranks a fault leaves behind."""
        return self._kept

    def rewind(self, seq: int, attempt: int) -> None:
        """Open the calls again from ``seq`` (a retry's agreed plan), for ``attempt``."""
        self._run.calls.rewind(seq, attempt)

    def attempt(self, call: Call, ending: Ending | None = None) -> Any:
        """Run one attempt of ``call``, whatever the recovery policy (no retry, no shrink)."""
        return call.attempt(self._run, ending)

    def record(
        self, op: str, arr: Array, algo: str, *, count: int, nbytes: int
    ) -> AbstractContextManager[Any]:
        """Open a call's record (and seq) where nothing runs in it."""
        return self._run.calls.open(op, arr, algo, count=count, nbytes=nbytes)

    def renew(self, transport: Transport) -> None:
        """Run the next calls over ``transport`` (a retry's renewed links)."""
        self._run.renew(transport)

    def shrink_in_place(self, call: str) -> ShrinkInfo | None:
        """Agree on the survivors (``call`` was interrupted) and run on as their
        communicator: their state takes this one's place (its callbacks stay)."""
        new = self.shrink(call=call)
        self._run, self._kept, self.shrink_info = new._run, new._kept, new.shrink_info
        self._on_close, new._on_close = new._on_close, None
        return self.shrink_info

    def shrunk(self, excluded: list[int]) -> None:
        """Tell the job's callbacks of an automatic shrink that dropped ``excluded``."""
        for callback in list(self._shrink_callbacks):
            callback(self, excluded)

    # ----------------------------------------------------------------- lifecycle
    def shrink(
        self, exclude: Collection[int] = (), timeout_s: float | None = None, *, call: str = ""
    ) -> Communicator:
        """The live ranks' communicator, renumbered in order; this one is closed, never
        waiting on the dead (``docs/fault-tolerance.md``; ``call``: the interrupted one)."""
        if self._shrinker is None:
            raise CommError(f"rank {self.rank}: {self.id} was not made by cclctl.init()")
        return self._shrinker(self, frozenset(exclude), timeout_s, call)

    def on_shrink(self, callback: OnShrink) -> None:
        """``callback(comm, excluded)`` after each automatic shrink, before the re-run."""
        self._shrink_callbacks.append(callback)

    def release(self) -> None:
        """Close the calls and the transport, not the job (a shrink hands the job on)."""
        if self.failure.close():
            self.transport.close()

    def abort(self, reason: str) -> None:
        """Make every blocked or future call on this communicator fail with ``reason``."""
        self.failure.abort(reason)

    def close(self) -> None:
        """Refuse every later call, tell the peers and close the links (idempotent). With
        retry on, first wait (up to the budget) for every rank to close, serving a retry
        that ranks behind need meanwhile (:meth:`.Retrying.closing`)."""
        if self.failure.closed:
            return
        self._recovery.closing()  # ranks behind may still need this rank's kept calls
        if not self.failure.close():
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
