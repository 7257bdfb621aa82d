"""One communicator's calls as they open and close: refused, numbered, recorded, failed.

Every collective and point-to-point call goes through :meth:`Calls.open`, which refuses a
call when the communicator's :class:`~cclctl.runtime.failure.FailureState` is not ok
(failed, aborted or closed), gives the call its sequence number (the same on every rank
for the same call), applies an injected fault, opens its trace record and builds the
:class:`Step` its algorithm runs. When the call ends, its record is closed; a failure
fails the communicator's state, since its links may hold half a message. This is the hot
path of every call, with telemetry on or off, so it touches as few objects as it can.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from cclctl.bandwidth import VARYING
from cclctl.config import RuntimeConfig
from cclctl.errors import CclError, CommRevoked
from cclctl.records import CollectiveRecord
from cclctl.runtime.algorithms.context import Scratch, Step
from cclctl.runtime.comm import buffers, faults
from cclctl.runtime.comm.tracing import Traced, Tracer, close_record
from cclctl.runtime.failure import OK, FailureState
from cclctl.runtime.identity import UNKNOWN, RankIdentity
from cclctl.runtime.transport.base import Transport, Wait, announcer
from cclctl.runtime.transport.wire import Call, comm_tag
from cclctl.telemetry.recorder import FOLD_BATCH


class Calls:
    """The calls of one communicator (``comm_id``, this process's ``rank`` of
    ``world_size``), over ``transport``; ``scratch`` is the algorithms' reusable memory.
    ``members``: each of its ranks' rank in the job (empty: the same), which records,
    errors and fault plans name; ``identity``: where its failures point (the failure state's).

    ``watchdog``: a watchdog thread expires hung calls through the failure state (see
    :meth:`FailureState.hung`), so calls wait without a deadline of their own.
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
        members: Sequence[int] = (),
        identity: RankIdentity = UNKNOWN,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.id = comm_id
        self.transport = transport
        self.scratch = scratch
        #: every call checks it when it opens and whenever it blocks
        self.failure = FailureState(
            members[rank] if members else rank, comm_id, announcer(transport), members, identity
        )
        self._tag = comm_tag(comm_id)
        self._timeout_s = math.inf if cfg.on_hang == "wait" or watchdog else cfg.timeout_s
        #: what ``CCLCTL_FAULT`` injects into these calls here (None: nothing, the usual case)
        self.injector = faults.injector(faults.parse(cfg.fault), self.failure.rank, comm_id)
        self._seq = 0
        #: a retry's attempt number, carried by every collective opened at a seq up to
        #: ``_rerun_upto`` (the seqs opened before the retry rewound): 1 beyond it
        self._attempt = 1
        self._rerun_upto = 0
        #: the last collective seq that completed here (what a shrink's agreement compares)
        self.completed = 0
        self._call = Call(self._tag, 0, 0, "")  # the call open now, or the last one
        self._tracer: Tracer | None = None
        self._trace: Callable[[CollectiveRecord], None] | None = None
        self._waits: object = None  # telemetry's PeerWaits: the time blocked on each peer

    def rewind(self, seq: int, attempt: int) -> None:
        """The next collective opens as ``seq`` (a retry runs a seq again); the calls at the
        seqs already opened carry ``attempt`` in their records."""
        self._rerun_upto = max(self._rerun_upto, self._seq)
        self._attempt = attempt
        self._seq = seq - 1

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
        self._waits = getattr(tracer, "peer_waits", None)

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
        A failed, aborted or closed communicator refuses the call before it is numbered.
        """
        failure = self.failure
        if failure.status is not OK:
            failure.refuse(op)
        if seq is None:
            self._seq += 1
            seq = self._seq
        count, nbytes, dtype = self._sized(arr, count, nbytes)
        attempt = self._attempt if seq <= self._rerun_upto and peer is None else 1
        injector = self.injector
        if injector is not None:
            op, count, dtype = injector.before(
                seq, attempt, peer is None, op, count, dtype, self.transport
            )
        epoch = failure.epoch
        rec = CollectiveRecord(
            comm=self.id,
            seq=seq,
            op=op,
            dtype=dtype,
            count=count,
            nbytes=nbytes,
            root=failure.job_rank(root) if root >= 0 else None,
            peer=None if peer is None else failure.job_rank(peer),
            epoch=epoch,
            attempt=attempt,
            algo=algo,
            start_ns=time.time_ns(),
        )
        wire_count = 0 if op in VARYING else count  # it differs by rank: each message is checked
        call = Call(self._tag, epoch, seq, op, dtype, redop, root, wire_count, shared)
        self._call = call
        now = time.monotonic()
        waits = self._waits
        wait = Wait(
            failure.rank, rec, now + self._timeout_s, now, failure, waits, None,
            None if waits is None else [],
        )  # fmt: skip
        step = Step(self.transport, self.rank, self.world_size, call, wait, self.scratch)
        return Traced(self._trace, rec, step, self._finished)

    def _sized(
        self, arr: np.ndarray, count: int | None, nbytes: int | None
    ) -> tuple[int, int, str]:
        """The call's count, bytes and dtype name (count and bytes: ``arr``'s unless given)."""
        count = arr.size if count is None else count
        nbytes = arr.nbytes if nbytes is None else nbytes
        return count, nbytes, buffers.dtype_name(arr.dtype)

    def _finished(self, rec: CollectiveRecord, exc: BaseException | None) -> None:
        injector = self.injector
        if injector is not None:
            injector.ended()
        final = exc if exc is None else self._failed(rec, exc)
        close_record(rec, final)
        if final is None and rec.peer is None:
            self.completed = rec.seq
        if not rec.seq % FOLD_BATCH:  # seqs count calls, per communicator or pair
            tracer = self._tracer
            if tracer is not None:
                tracer.fold()
        if final is not None and final is not exc:
            raise final from exc

    def _failed(self, rec: CollectiveRecord, exc: BaseException) -> BaseException:
        """Fail the communicator with the call's error; the error the call raises then
        names the failure's origin (this rank's own error only if it is the origin's)."""
        call = self._call
        if call.seq != rec.seq or call.op != rec.op:  # a point-to-point call opened beside it
            call = Call(self._tag, rec.epoch, rec.seq, rec.op, rec.dtype, "", -1, rec.count)
        first = self.failure.call_failed(exc, rec, call.what())
        if not isinstance(exc, CclError):
            return exc  # not ours to rename (KeyboardInterrupt, a bug): it is recorded
        exc.fields.setdefault("comm", self.id)
        exc.fields.setdefault("rank", self.failure.rank)
        final: CclError = exc
        own_words = (  # this rank's own account of its failure (a peer's relay of it is not)
            exc.revocation is first
            and first is not None
            and first.kind in ("hang", "error")
            and not isinstance(exc, CommRevoked)
        )
        if first is not None and not own_words:
            where = f"rank {self.failure.rank}: {call.what()} seq {call.seq}"  # else: its own
            waited = {  # what the record knows of the wait, where the error does not say
                "elapsed": round((time.time_ns() - rec.start_ns) / 1e9, 3),
                "what": rec.waiting_for,
                "peer": rec.waiting_on,
            }
            fields = {**waited, **exc.fields, "op": call.op, "seq": call.seq}
            final = self.failure.error(first, where, **fields)
        evidence = self.failure.evidence
        if evidence and first is not None and "; dumps in " not in final.message:
            final.message += f"; dumps in {evidence}"
            final.args = (final.message,)
        return final
