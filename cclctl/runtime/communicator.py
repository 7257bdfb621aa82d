"""The communicator: torch.distributed-style collectives on numpy arrays, traced end to end.

Each call checks its buffers, takes the next sequence number (the same on every rank for the
same call), opens a trace record, runs the algorithm chosen for its size and closes the
record. The record is what telemetry counts, what the flight recorder keeps and what
diagnosis reads, so every rank can always say which collective it is in and whom it waits on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.errors import CclError, CommAborted, CommError
from cclctl.records import CollectiveRecord
from cclctl.runtime import buffers, faults, selection, shared_buffers
from cclctl.runtime.algorithms import latency, pairwise, pipeline, ring, zero_copy
from cclctl.runtime.algorithms.context import (
    Scratch,
    Step,
    as_bytes,
    chunk_bounds,
    finish_avg,
)
from cclctl.runtime.prepared import PreparedCalls
from cclctl.runtime.tracing import Traced, Tracer, close_record
from cclctl.runtime.transport import Transport, Wait
from cclctl.runtime.wire import Call, comm_tag
from cclctl.telemetry.recorder import FOLD_BATCH

_SIZES_KEPT = 256  # distinct call sizes a communicator shares int objects for (see _call)

Array = np.ndarray


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
    ) -> None:
        """``watchdog``: a watchdog thread marks timed-out records (and aborts under the
        ``abort`` policy), so calls wait on that mark instead of a deadline of their own.
        """
        self.rank = rank
        self.world_size = world_size
        self.id = comm_id
        self.epoch = 0
        self.cfg = cfg
        self.transport = transport
        self._tracer: Tracer | None = None
        self._trace: Callable[[CollectiveRecord], None] | None = None
        self.tracer = tracer
        self._tag = comm_tag(comm_id)
        self._selection = selection.parse(cfg.algo)
        self._timeout_s = math.inf if cfg.on_hang == "wait" or watchdog else cfg.timeout_s
        self._watched = watchdog and cfg.on_hang == "raise"
        self._faults = faults.parse(cfg.fault)
        self._scratch = Scratch()
        self._prepared = PreparedCalls()  # zero-copy calls' checks, for the same arrays again
        self._seq = 0
        self._sizes: dict[int, int] = {}  # see _call
        self._p2p_sent = [0] * world_size
        self._p2p_received = [0] * world_size
        self._broken: str | None = None
        self._abort_reason: str | None = None
        self._on_close = on_close
        self._closed = False

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

    # ----------------------------------------------------------------- buffers
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

    def _zero_copy(self, nbytes: int, *arrays: Array) -> zero_copy.Plan | None:
        return zero_copy.plan(self.transport, self.world_size, nbytes, arrays)

    def _remembered(
        self, op: str, buf: Array, out: Array | None
    ) -> tuple[zero_copy.Plan | None, Array, Array]:
        """The plan of a recent zero-copy ``op`` on these very arrays, with their flat views
        (unchecked: the arrays passed every check then); ``(None, buf, buf)`` if none."""
        zc = self._prepared.get(op, buf, out)
        if zc is None:
            return None, buf, buf
        src = buf.reshape(-1)
        return zc, src, src if out is None else out.reshape(-1)

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, buf: Array, op: str = "sum", out: Array | None = None) -> Array:
        buffers.check_redop(op, "all_reduce")
        zc, src, dst = self._remembered("all_reduce", buf, out)
        if zc is None:
            src, dst = buffers.reduce_args(buf, out, "all_reduce")
            zc = self._zero_copy(src.nbytes, src, dst)
            if zc is not None:
                self._prepared.keep("all_reduce", (buf, out), zc)
        if zc is not None:
            with self._call("all_reduce", src, zero_copy.ALGO, redop=op, shared=True) as step:
                zero_copy.all_reduce(step, zc[0], src, dst, op, zc[1])
                if op == "avg":
                    finish_avg(dst, self.world_size)
            return dst if out is None else out
        algo = self._selection.choose("all_reduce", src.nbytes)
        with self._call("all_reduce", src, algo, redop=op) as step:
            if self.world_size == 1 or src.size < self.world_size or algo == "rd":
                if dst is not src:
                    dst[...] = src
                if src.size:
                    latency.all_reduce(step, dst, op)
            else:
                ring.all_reduce(step, src, dst, op, chunk_bounds(src.size, self.world_size))
            if op == "avg":
                finish_avg(dst, self.world_size)
        return dst if out is None else out

    def all_gather(self, buf: Array, out: Array) -> Array:
        n = self.world_size
        prepared = self._prepared.get("all_gather", buf, out)
        if prepared is not None:
            zc, bounds, copy_in, staged = prepared
            src, dst = buf.reshape(-1), out.reshape(-1)
        else:
            src, dst, in_slot = buffers.gather_args(buf, out, n, self.rank)
            bounds = [(i * src.size, (i + 1) * src.size) for i in range(n)]
            # Zero-copy: peers read this rank's block from a shared ``buf`` while this rank
            # copies it into ``out`` (the two copies overlap), else from its slot of ``out``.
            zc = None if in_slot else self._zero_copy(dst.nbytes, src)
            copy_in = zc is not None
            staged = not in_slot and not copy_in  # buf goes to its slot of out first
            if zc is None:
                zc = self._zero_copy(dst.nbytes, dst[bounds[self.rank][0] : bounds[self.rank][1]])
            if zc is not None:
                self._prepared.keep("all_gather", (buf, out), (zc, bounds, copy_in, staged))
        if staged:
            lo, hi = bounds[self.rank]
            dst[lo:hi] = src
        if zc is not None:
            with self._call(
                "all_gather", src, zero_copy.ALGO, nbytes=dst.nbytes, shared=True
            ) as step:
                zero_copy.all_gather(step, zc[0], dst, bounds, zc[1][0], src if copy_in else None)
            return out
        with self._call("all_gather", src, "ring", nbytes=dst.nbytes) as step:
            if src.size:
                ring.all_gather(step, dst, bounds)
        return out

    def reduce_scatter(self, buf: Array, out: Array, op: str = "sum") -> Array:
        n = self.world_size
        buffers.check_redop(op, "reduce_scatter")
        prepared = self._prepared.get("reduce_scatter", buf, out)
        if prepared is not None:
            zc, bounds = prepared
            return self._reduce_scatter(buf.reshape(-1), out.reshape(-1), op, zc, bounds, out)
        src, dst = buffers.scatter_args(buf, out, n, self.rank)
        k = dst.size
        bounds = [(i * k, (i + 1) * k) for i in range(n)]
        zc = self._zero_copy(src.nbytes, src)
        if zc is not None:
            self._prepared.keep("reduce_scatter", (buf, out), (zc, bounds))
        return self._reduce_scatter(src, dst, op, zc, bounds, out)

    def _reduce_scatter(
        self,
        src: Array,
        dst: Array,
        op: str,
        zc: zero_copy.Plan | None,
        bounds: list[tuple[int, int]],
        out: Array,
    ) -> Array:
        n, k = self.world_size, dst.size
        algo = "ring" if zc is None else zero_copy.ALGO
        with self._call(
            "reduce_scatter", src, algo, redop=op, count=k, shared=zc is not None
        ) as step:
            if zc is not None:
                zero_copy.reduce_scatter(step, zc[0], src, dst, bounds, op, zc[1][0])
            elif k:
                ring.reduce_scatter(step, src, dst, bounds, op)
            if k and op == "avg":
                finish_avg(dst, n)
        return out

    def broadcast(self, buf: Array, root: int = 0, out: Array | None = None) -> Array:
        root = buffers.check_root(root, self.world_size, "broadcast")
        zc, src, dst = self._remembered("broadcast", buf, out)
        if zc is None:
            src, dst = buffers.in_out(buf, out, "broadcast", writable=out is None)
            zc = self._zero_copy(dst.nbytes, dst)
            if zc is not None:
                self._prepared.keep("broadcast", (buf, out), zc)
        if self.rank == root and dst is not src:
            dst[...] = src
        if zc is not None:
            with self._call("broadcast", src, zero_copy.ALGO, root=root, shared=True) as step:
                zero_copy.broadcast(step, zc[0], dst, root, zc[1][0])
            return dst if out is None else out
        algo = self._selection.choose("broadcast", src.nbytes)
        with self._call("broadcast", src, algo, root=root) as step:
            if algo == "chain":
                pipeline.broadcast(step, dst, root)
            elif src.size:
                latency.broadcast(step, dst, root)
        return dst if out is None else out

    def reduce(self, buf: Array, op: str = "sum", root: int = 0, out: Array | None = None) -> Array:
        src, dst = buffers.in_out(buf, out, "reduce", writable=out is None and self.rank == root)
        buffers.check_redop(op, "reduce")
        root = buffers.check_root(root, self.world_size, "reduce")
        algo = self._selection.choose("reduce", src.nbytes)
        if src.size < self.world_size:
            algo = "tree"
        with self._call("reduce", src, algo, redop=op, root=root) as step:
            if algo == "ring":
                bounds = chunk_bounds(src.size, self.world_size)
                lo, hi = bounds[self.rank]
                mine = self._scratch.get(5, hi - lo, src.dtype)
                steps = ring.reduce_scatter(step, src, mine, bounds, op)
                pairwise.gather_chunks(step, mine, dst, bounds, root, steps)
            elif src.size:
                acc = self._scratch.get(4, src.size, src.dtype)
                acc[...] = src
                latency.reduce(step, acc, op, root)
                if self.rank == root:
                    dst[...] = acc
            if op == "avg" and self.rank == root:
                finish_avg(dst, self.world_size)
        return dst if out is None else out

    def all_to_all(self, buf: Array, out: Array) -> Array:
        n = self.world_size
        src = buffers.flat(buf, "buf", "all_to_all")
        if src.size % n:
            raise buffers.InvalidArgument(
                f"all_to_all: buf has {src.size} elements, not a multiple of the world size {n}",
                op="all_to_all",
            )
        dst = buffers.matching_out(out, src, src.size, "all_to_all")
        with self._call("all_to_all", src, "pairwise") as step:
            if buffers.overlaps(src, dst):
                copy = self._scratch.get(4, src.size, src.dtype)
                copy[...] = src
                src = copy
            if src.size:
                pairwise.all_to_all(step, src, dst, src.size // n)
        return out

    def send(self, buf: Array, dst: int) -> None:
        src = buffers.flat(buf, "buf", "send")
        peer = buffers.check_peer(dst, self.rank, self.world_size, "send")
        self._p2p_sent[peer] += 1
        with self._call("send", src, "direct", peer=peer, seq=self._p2p_sent[peer]) as step:
            step.xfer(0, sends=[(peer, as_bytes(src))])

    def recv(self, buf: Array, src: int) -> Array:
        dst = buffers.flat(buf, "buf", "recv", writable=True)
        peer = buffers.check_peer(src, self.rank, self.world_size, "recv")
        self._p2p_received[peer] += 1
        with self._call("recv", dst, "direct", peer=peer, seq=self._p2p_received[peer]) as step:
            step.xfer(0, recvs=[(peer, as_bytes(dst))])
        return buf

    def barrier(self) -> None:
        token = np.zeros(1, dtype=np.uint8)
        with self._call("barrier", token, "rd", redop="max", nbytes=0) as step:
            latency.all_reduce(step, token, "max")

    # ----------------------------------------------------------------- lifecycle
    def abort(self, reason: str) -> None:
        """Make every blocked or future call on this communicator fail with ``reason``."""
        self._abort_reason = reason

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.transport.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Communicator {self.id} rank {self.rank}/{self.world_size} {self.transport.name}>"

    # ----------------------------------------------------------------- internals
    def _aborted(self) -> str | None:
        return self._abort_reason

    def _call(
        self,
        op: str,
        arr: Array,
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
        if self._closed:
            raise CommError(f"rank {self.rank}: {op} on a closed communicator", op=op)
        if self._broken is not None:
            raise CommAborted(
                f"rank {self.rank}: communicator {self.id} is unusable after an earlier "
                f"failure ({self._broken}); create a new one",
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
            "send" if op == "recv" else op,
            dtype,
            redop,
            root,
            count,
            shared,
        )
        now = time.monotonic()
        wait = Wait(self.rank, rec, now + self._timeout_s, now, self._aborted, self._watched)
        step = Step(self.transport, self.rank, self.world_size, call, wait, self._scratch)
        return Traced(self._trace, rec, step, self._finished)

    def _finished(self, rec: CollectiveRecord, exc: BaseException | None) -> None:
        close_record(rec, exc)
        if exc is not None:
            # The links may hold half a message now: no later call can trust them.
            self._broken = f"{rec.op} seq {rec.seq}: {rec.error}"
            if isinstance(exc, CclError):
                exc.fields.setdefault("comm", self.id)
                exc.fields.setdefault("rank", self.rank)
        if not rec.seq % FOLD_BATCH:  # seqs count calls, per communicator or pair
            tracer = self._tracer
            if tracer is not None:
                tracer.fold()
