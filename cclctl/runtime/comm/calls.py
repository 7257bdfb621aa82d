"""One communicator's calls as they open and close: refused, numbered, recorded, failed.

Every collective and point-to-point call goes through :meth:`Calls.open`, which refuses a
closed or broken communicator, gives the call its sequence number (the same on every rank
for the same call), applies an injected fault, opens its trace record and builds the
:class:`Step` its algorithm runs. When the call ends, its record is closed; a failure breaks
the communicator, since its links may hold half a message. This is the hot path of every
call, with telemetry on or off, so it touches as few objects as it can.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.errors import CclError, CommAborted, CommError
from cclctl.records import CollectiveRecord
from cclctl.runtime.algorithms.context import Scratch, Step
from cclctl.runtime.comm import buffers
from cclctl.runtime.comm.tracing import Traced, Tracer, close_record
from cclctl.runtime.job import faults
from cclctl.runtime.transport.base import Transport, Wait
from cclctl.runtime.transport.wire import Call, comm_tag
from cclctl.telemetry.recorder import FOLD_BATCH

_SIZES_KEPT = 256  # distinct call sizes whose int objects the records share (see open)


class Calls:
    """The calls of one communicator (``comm_id``, this process's ``rank`` of
    ``world_size``), over ``transport``; ``scratch`` is the algorithms' reusable memory.

    ``watchdog``: a watchdog thread marks timed-out records (and aborts under the ``abort``
    policy), so calls wait on that mark instead of a deadline of their own.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        comm_id: str,
        transport: Transport,
        cfg: RuntimeConfig,
        scratch: Scratch,
        watchdog: bool,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.id = comm_id
        self.epoch = 0  # recorded with every call; nothing renews a communicator in place yet
        self.transport = transport
        self.scratch = scratch
        self.closed = False
        #: why a failed call made this communicator unusable (None: it is not)
        self.broken: str | None = None
        #: why :meth:`abort` was called (None: it was not): blocked calls fail with it
        self.abort_reason: str | None = None
        self._tag = comm_tag(comm_id)
        self._timeout_s = math.inf if cfg.on_hang == "wait" or watchdog else cfg.timeout_s
        self._watched = watchdog and cfg.on_hang == "raise"
        self._faults = faults.parse(cfg.fault)
        self._seq = 0
        self._sizes: dict[int, int] = {}
        self._tracer: Tracer | None = None
        self._trace: Callable[[CollectiveRecord], None] | None = None

    @property
    def tracer(self) -> Tracer | None:
        """Telemetry that sees every call (None: calls are not recorded)."""
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        # Each call reaches the tracer's queue through this one bound method: the fewer
        # objects a call touches, the less it pays in cache misses after a large reduction.
        self._tracer = tracer
        self._trace = None if tracer is None else tracer.start

    def _aborted(self) -> str | None:
        return self.abort_reason

    def open(
        self,
        op: str,
        arr: np.ndarray,
        algo: str,
        *,
        redop: str = "",
        root: int = -1,
        peer: int | None = None,
        seq: int | None = None,
        count: int | None = None,
        nbytes: int | None = None,
        shared: bool = False,
    ) -> Traced[Step]:
        """The next call, ``op`` on ``arr`` by ``algo``, as a context manager that records
        it around the ``with`` body and yields the step the algorithm runs.

        ``seq`` is given for point-to-point calls (their per-pair sequence); ``count`` and
        ``nbytes`` where the call's size is not ``arr``'s (gathered and scattered buffers).
        """
        if self.closed:
            raise CommError(f"rank {self.rank}: {op} on a closed communicator", op=op)
        if self.broken is not None:
            raise CommAborted(
                f"rank {self.rank}: communicator {self.id} is unusable after an earlier "
                f"failure ({self.broken}); create a new one",
                rank=self.rank,
                comm=self.id,
                op=op,
            )
        if seq is None:
            self._seq += 1
            seq = self._seq
        # One int object per size, shared by every record of it: each record the flight
        # recorder keeps would otherwise keep two fresh ints, allocated and later freed
        # in memory a large reduction has long since pushed out of the caches.
        sizes = self._sizes
        if len(sizes) > _SIZES_KEPT:
            sizes.clear()
        count = arr.size if count is None else count
        count = sizes.setdefault(count, count)
        nbytes = arr.nbytes if nbytes is None else nbytes
        nbytes = sizes.setdefault(nbytes, nbytes)
        dtype = buffers.dtype_name(arr.dtype)
        fault = self._faults.at(self.rank, seq, self.id) if self._faults else None
        if fault is not None:
            op, count, dtype = faults.strike(fault, op, count, dtype, self.transport.drop_link)
        rec = CollectiveRecord(
            comm=self.id,
            seq=seq,
            op=op,
            dtype=dtype,
            count=count,
            nbytes=nbytes,
            root=root if root >= 0 else None,
            peer=peer,
            epoch=self.epoch,
            algo=algo,
            start_ns=time.time_ns(),
        )
        call = Call(
            self._tag,
            self.epoch,
            seq,
            op,
            dtype,
            redop,
            root,
            count,
            shared,
        )
        now = time.monotonic()
        wait = Wait(self.rank, rec, now + self._timeout_s, now, self._aborted, self._watched)
        step = Step(self.transport, self.rank, self.world_size, call, wait, self.scratch)
        return Traced(self._trace, rec, step, self._finished)

    def _finished(self, rec: CollectiveRecord, exc: BaseException | None) -> None:
        close_record(rec, exc)
        if exc is not None:
            # The links may hold half a message now: no later call can trust them.
            self.broken = f"{rec.op} seq {rec.seq}: {rec.error}"
            if isinstance(exc, CclError):
                exc.fields.setdefault("comm", self.id)
                exc.fields.setdefault("rank", self.rank)
        if not rec.seq % FOLD_BATCH:  # seqs count calls, per communicator or pair
            tracer = self._tracer
            if tracer is not None:
                tracer.fold()
