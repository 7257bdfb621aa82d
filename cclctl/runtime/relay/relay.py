"""The relay: collectives on device buffers, staged through host memory over a communicator.

:class:`Relay` runs each collective on buffers a :class:`~.copier.Copier` can copy to and
from the host (device tensors through the torch adapter, ``cclctl.integrations.torch.relay_copier``;
numpy arrays through :class:`~.copier.HostCopier`): chunks of the buffer are loaded into a
fixed ring of staging buffers (:class:`~.pool.StagingPool`, ``CCLCTL_STAGE_CHUNK`` bytes x
``CCLCTL_STAGE_DEPTH``), the communicator runs the collective on each chunk in host memory,
and the result is stored back, pipelined (:mod:`.pipeline`). Each relayed call is one
trace record of its own, on the communicator's relay id (``<comm>/relay``, its own seq, the
same on every rank), whose ``stages`` say how long the loads, the host collectives and the
stores took; it reaches telemetry once it has ended. The host collective of each chunk is
a call of the communicator, recorded as any other: that is what is in flight while a relay
runs (and what the watchdog would find hung).

Every rank of a communicator must relay a call alike (the chunks are calls of the
communicator): in a job whose ranks mix device and CPU tensors, ``CCLCTL_STAGE=always``
makes the CPU ranks stage too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.errors import InvalidArgument
from cclctl.records import CollectiveRecord
from cclctl.runtime.comm import buffers
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.comm.tracing import close_record
from cclctl.runtime.relay import plans
from cclctl.runtime.relay.copier import Copier
from cclctl.runtime.relay.pipeline import HostCall, relay
from cclctl.runtime.relay.plans import Chunk
from cclctl.runtime.relay.pool import StagingPool


def relay_comm_id(comm_id: str) -> str:
    """The id relayed calls are recorded under: the communicator's, marked as the relay's."""
    return f"{comm_id}/relay"


def is_staged(cfg: RuntimeConfig, on_host: bool) -> bool:
    """Whether a buffer goes through the relay under ``CCLCTL_STAGE`` (``on_host``: it is
    in CPU memory already): ``auto`` stages device buffers only, ``always`` every buffer,
    ``never`` none (a device buffer is then refused)."""
    if cfg.stage == "always":
        return True
    if on_host:
        return False
    if cfg.stage == "never":
        raise InvalidArgument(
            "CCLCTL_STAGE=never: a device buffer would be staged through host memory; "
            "pass a CPU buffer or set CCLCTL_STAGE=auto"
        )
    return True


class Relay:
    """The collectives of ``comm`` on buffers ``copier`` moves, through one staging ring."""

    def __init__(
        self, comm: Communicator, copier: Copier, cfg: RuntimeConfig | None = None
    ) -> None:
        cfg = cfg or comm.cfg
        self.comm = comm
        self.copier = copier
        self.pool = StagingPool(copier, cfg.stage_chunk, cfg.stage_depth)
        self._seq = 0
        self._declared = ""  # the relay id last declared to telemetry
        #: the last relayed call's record (its ``stages``), telemetry on or off
        self.last: CollectiveRecord | None = None

    @property
    def id(self) -> str:
        """The id this relay's calls are recorded under (it follows a shrink in place)."""
        return relay_comm_id(self.comm.id)

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, buf: Any, op: str = "sum", out: Any = None) -> Any:
        buffers.check_redop(op, "all_reduce")
        dst = buf if out is None else out
        count, dtype = self._check(buf, dst, 1, "all_reduce")

        def call(_: Chunk, inp: np.ndarray, res: np.ndarray) -> None:
            self.comm.all_reduce(inp, op)

        chunks = plans.whole(count, self.pool.elements(dtype))
        self._run("all_reduce", buf, dst, count, dtype, chunks, call)
        return dst

    def broadcast(self, buf: Any, root: int = 0, out: Any = None) -> Any:
        root = buffers.check_root(root, self.comm.world_size, "broadcast")
        dst = buf if out is None else out
        count, dtype = self._check(buf, dst, 1, "broadcast")
        mine = self.comm.rank == root

        def call(_: Chunk, inp: np.ndarray, res: np.ndarray) -> None:
            self.comm.broadcast(inp, root)

        store = not mine or dst is not buf
        chunks = plans.whole(count, self.pool.elements(dtype), load=mine, store=store)
        self._run("broadcast", buf, dst, count, dtype, chunks, call, root=root)
        return dst

    def reduce(self, buf: Any, op: str = "sum", root: int = 0, out: Any = None) -> Any:
        buffers.check_redop(op, "reduce")
        root = buffers.check_root(root, self.comm.world_size, "reduce")
        dst = buf if out is None else out
        count, dtype = self._check(buf, dst, 1, "reduce")

        def call(_: Chunk, inp: np.ndarray, res: np.ndarray) -> None:
            self.comm.reduce(inp, op, root)

        store = self.comm.rank == root
        chunks = plans.whole(count, self.pool.elements(dtype), store=store)
        self._run("reduce", buf, dst, count, dtype, chunks, call, root=root)
        return dst

    def all_gather(self, buf: Any, out: Any) -> Any:
        n = self.comm.world_size
        count, dtype = self._check(buf, out, n, "all_gather")

        def call(_: Chunk, inp: np.ndarray, res: np.ndarray) -> None:
            self.comm.all_gather(inp, res)

        chunks = plans.gather(count, n, self.pool.elements(dtype))
        self._run("all_gather", buf, out, count, dtype, chunks, call, nbytes=n)
        return out

    def reduce_scatter(self, buf: Any, out: Any, op: str = "sum") -> Any:
        buffers.check_redop(op, "reduce_scatter")
        n = self.comm.world_size
        count, dtype = self._check(out, buf, n, "reduce_scatter")

        def call(_: Chunk, inp: np.ndarray, res: np.ndarray) -> None:
            self.comm.reduce_scatter(inp, res, op)

        chunks = plans.scatter(count, n, self.pool.elements(dtype))
        self._run("reduce_scatter", buf, out, n * count, dtype, chunks, call, nbytes=1)
        return out

    def all_to_all(self, buf: Any, out: Any) -> Any:
        n = self.comm.world_size
        total, dtype = self._check(buf, out, 1, "all_to_all")
        if total % n:
            raise InvalidArgument(
                f"all_to_all: buf has {total} elements, not a multiple of the world size {n}",
                op="all_to_all",
            )

        def call(_: Chunk, inp: np.ndarray, res: np.ndarray) -> None:
            self.comm.all_to_all(inp, res)

        chunks = plans.exchange(total // n, n, self.pool.elements(dtype))
        self._run("all_to_all", buf, out, total, dtype, chunks, call)
        return out

    # ----------------------------------------------------------------- one relayed call
    def _check(self, small: Any, large: Any, times: int, op: str) -> tuple[int, np.dtype]:
        """``small``'s count and dtype, once ``large`` holds ``times`` as many of it."""
        count, dtype = self.copier.describe(small)
        other, other_dtype = self.copier.describe(large)
        if other_dtype != dtype:
            raise InvalidArgument(f"{op}: out has dtype {other_dtype} but buf {dtype}", op=op)
        if other != count * times:
            raise InvalidArgument(f"{op}: {other} elements where {count * times} fit", op=op)
        if buffers.dtype_name(dtype) not in buffers.SUPPORTED_DTYPES:
            raise InvalidArgument(f"{op}: cclctl does not relay {dtype}", op=op)
        return count, dtype

    def _run(
        self,
        op: str,
        src: Any,
        dst: Any,
        count: int,
        dtype: np.dtype,
        chunks: Sequence[Chunk],
        call: HostCall,
        *,
        root: int = -1,
        nbytes: int = 1,
    ) -> None:
        """Relay ``chunks`` of ``src`` into ``dst`` by ``call``, recorded as ``op``
        (``count`` elements per rank as the caller passed them; ``nbytes``: the recorded
        size in ``count``'s bytes, nccl-tests' full buffer for all_gather)."""
        rec = self.last = self._record(op, count, dtype, count * dtype.itemsize * nbytes, root)
        try:
            rec.stages = relay(self.pool, src, dst, dtype, chunks, call)
        except BaseException as exc:
            close_record(rec, exc)
            raise
        else:
            close_record(rec, None)
        finally:
            # Handed over ended: what is in flight meanwhile is the chunk's own call, which
            # the watchdog and the diagnosis see; a relayed call is never a hang of its own.
            start: Callable[[CollectiveRecord], None] | None = getattr(
                self.comm.tracer, "start", None
            )
            if start is not None:
                start(rec)

    def _record(
        self, op: str, count: int, dtype: np.dtype, nbytes: int, root: int
    ) -> CollectiveRecord:
        self._seq += 1
        comm_id = self.id
        if comm_id != self._declared:  # its members size the bus bytes telemetry counts
            register = getattr(self.comm.tracer, "register_comm", None)
            if register is not None:
                register(comm_id, self.comm.members)
                self._declared = comm_id
        return CollectiveRecord(
            comm=comm_id,
            seq=self._seq,
            op=op,
            dtype=buffers.dtype_name(dtype),
            count=count,
            nbytes=nbytes,
            root=self.comm.members[root] if root >= 0 else None,
            algo="relay",
            start_ns=time.time_ns(),
        )
