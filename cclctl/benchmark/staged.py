"""`cclctl bench --stage always`: the sweep's collectives through the relay, stage by stage.

:class:`StagedComm` is the benchmark's communicator over a :class:`~cclctl.runtime.relay.
relay.Relay` on the sweep's own communicator: every collective the relay runs (all_reduce,
all_gather, reduce_scatter, broadcast, reduce, all_to_all) is staged through its ring of
host buffers by a :class:`~cclctl.runtime.relay.copier.ThreadCopier` (a copy thread
standing in for a device's copy engine, so the copies overlap the host collectives as they
would on a device), and the ``stages`` of each relayed call's record are summed until
:meth:`StagedComm.take`. Point-to-point calls (sendrecv) and barriers are not relayed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cclctl.runtime.relay.copier import ThreadCopier
from cclctl.runtime.relay.pipeline import STAGES
from cclctl.runtime.relay.relay import Relay

Array = np.ndarray


class StagedComm:
    """The collectives of ``comm`` (cclctl's runtime communicator) relayed through host
    staging, their stage nanoseconds summed per call."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self._copier = ThreadCopier()
        self._relay = Relay(comm, self._copier)
        self._totals = dict.fromkeys(STAGES, 0)
        self._calls = 0

    @property
    def rank(self) -> int:
        return int(self._comm.rank)

    @property
    def world_size(self) -> int:
        return int(self._comm.world_size)

    def _count(self) -> None:
        last = self._relay.last
        if last is not None and last.stages:
            for name in STAGES:
                self._totals[name] += int(last.stages.get(name, 0))
        self._calls += 1

    def take(self) -> tuple[int, dict[str, int]]:
        """The relayed calls since the last take and their summed stage nanoseconds."""
        taken = (self._calls, self._totals)
        self._totals, self._calls = dict.fromkeys(STAGES, 0), 0
        return taken

    # -- relayed collectives -------------------------------------------------------------

    def all_reduce(self, buf: Array, op: str = "sum", out: Array | None = None) -> Array:
        result: Array = self._relay.all_reduce(buf, op=op, out=out)
        self._count()
        return result

    def all_gather(self, buf: Array, out: Array) -> Array:
        result: Array = self._relay.all_gather(buf, out)
        self._count()
        return result

    def reduce_scatter(self, buf: Array, out: Array, op: str = "sum") -> Array:
        result: Array = self._relay.reduce_scatter(buf, out, op=op)
        self._count()
        return result

    def broadcast(self, buf: Array, root: int = 0, out: Array | None = None) -> Array:
        result: Array = self._relay.broadcast(buf, root=root, out=out)
        self._count()
        return result

    def reduce(self, buf: Array, op: str = "sum", root: int = 0, out: Array | None = None) -> Array:
        result: Array = self._relay.reduce(buf, op=op, root=root, out=out)
        self._count()
        return result

    def all_to_all(self, buf: Array, out: Array) -> Array:
        result: Array = self._relay.all_to_all(buf, out)
        self._count()
        return result

    # -- not relayed -----------------------------------------------------------------------

    def send(self, buf: Array, dst: int) -> object:
        return self._comm.send(buf, dst)

    def recv(self, buf: Array, src: int) -> object:
        return self._comm.recv(buf, src)

    def barrier(self) -> object:
        return self._comm.barrier()

    def close(self) -> None:
        """End the copy thread; the communicator stays open (the sweep does not own it)."""
        self._copier.close()
