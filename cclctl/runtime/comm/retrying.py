"""``CCLCTL_RETRY_BUDGET``: a collective that a broken or stalled TCP link interrupted runs again.

Every rank of the communicator abandons the attempt (the failure state spreads it as any
failure), they agree in the job's store that the call is retried, the transport is renewed
under the next epoch (:mod:`cclctl.runtime.job.retry`), and the call runs again from its
input: an in-place call keeps a copy of its input while retry is on, so a partly reduced
buffer is never reduced twice and the result is the one a fault-free run gives.

Every collective re-runs (:data:`RERUNS`). A fault can leave the ranks one call apart (some
completed seq ``s``, others did not): where seq ``s``'s result is the same on every rank
(:data:`SHARED`: all_reduce, all_gather, broadcast, barrier) the ranks behind receive it
from the lowest rank ahead (a broadcast at seq ``s``); where it differs by rank
(reduce_scatter, reduce, all_to_all) the ranks ahead run seq ``s`` once more from a copy
of its input, with the ranks behind, and drop what it gives them. Then the ranks ahead
re-run seq ``s + 1``. Past the budget, counted from the first fault of the call, every
rank raises that fault's error (naming its origin), with its in-place buffer holding the
input again. Point-to-point calls are not re-run: a link fault fails them as with retry
off, and the rank's refusal goes to the next epoch's agreement (:func:`not_rerun`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cclctl.errors import CclError, CommError
from cclctl.runtime.comm import buffers
from cclctl.runtime.comm.rerun import Inputs, Replay

if TYPE_CHECKING:
    from cclctl.runtime.comm.communicator import Communicator

log = logging.getLogger("cclctl.runtime")

#: The transports whose links a retry renews (shared memory alone has none to break).
RETRIED_TRANSPORTS = ("tcp", "hybrid")
#: The calls whose result every rank holds alike: a rank one call behind takes it from a
#: rank ahead.
SHARED = ("all_reduce", "all_gather", "broadcast", "barrier")
#: The calls a retry runs again: those, and the ones whose result differs by rank, which
#: the ranks ahead of a rank one call behind run again with it.
RERUNS = (*SHARED, "reduce_scatter", "reduce", "all_to_all")
#: Revocation kinds a retry recovers from: a link broke or stalled between live ranks, or
#: an operator asked for a retry (``cclctl retry``).
RETRIED_KINDS = ("link", "retry")


@dataclasses.dataclass(frozen=True)
class Ask:
    """What a rank brings to a retry: the call it was in, the collective seq it has not
    completed (``pending``), the seq of the call it kept (:class:`~.rerun.Kept`), its
    attempt number and the budget's deadline (``time.monotonic()``)."""

    call: str
    pending: int
    kept: int
    attempt: int
    deadline: float


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every rank agreed: re-run seq ``seq`` (``root`` < 0), or first catch up the
    ranks behind with seq ``seq``'s result from ``root`` (a broadcast); with ``replay``,
    the ranks ahead run seq ``seq`` again from its kept input, with the ranks behind."""

    seq: int
    root: int = -1
    replay: bool = False


class Retrier(Protocol):
    """The job's side of a retry (:class:`cclctl.runtime.job.retry.Retry`)."""

    def __call__(self, comm: Communicator, ask: Ask) -> Plan:
        """Agree with every rank and renew the transport; raises :class:`CommError` when
        that cannot be done within the deadline."""

    def refuse(self, comm: Communicator, ask: Ask) -> None:
        """Tell the agreement, without waiting, that this rank's call is not re-run."""


def enabled(comm: Communicator) -> bool:
    """Retry is on for ``comm``: a budget, and TCP links under it."""
    return comm.cfg.retry_budget_s > 0 and comm.transport.name in RETRIED_TRANSPORTS


def why_not(comm: Communicator) -> str:
    """Why ``comm`` cannot retry, in words (empty when it can)."""
    if comm.cfg.retry_budget_s <= 0:
        return "CCLCTL_RETRY_BUDGET=0 turns retry off"
    if comm.transport.name not in RETRIED_TRANSPORTS:
        return f"its {comm.transport.name} transport has no TCP links to renew"
    return ""


def retryable(exc: CommError) -> bool:
    """A failure a retry recovers from: a link broke or stalled (the revoke record says so)."""
    rev = exc.revocation
    return rev is not None and rev.kind in RETRIED_KINDS


def all_reduce(comm: Communicator, buf: np.ndarray, op: str, out: np.ndarray | None) -> Any:
    """``comm.all_reduce`` that renews broken links and runs again from its input."""
    inputs = Inputs.of(buf, out)
    answer = inputs.dst if out is None else out
    return _run(comm, "all_reduce", lambda: comm._all_reduce(buf, op, out), inputs, answer)


def all_gather(comm: Communicator, buf: np.ndarray, out: np.ndarray) -> Any:
    """``comm.all_gather`` that renews broken links and runs again (its input is never
    written: ``buf`` is disjoint from ``out`` or already this rank's slot of it)."""
    _, dst, _ = buffers.gather_args(buf, out, comm.world_size, comm.rank)
    return _run(comm, "all_gather", lambda: comm._all_gather(buf, out), Inputs.kept(dst), out)


def broadcast(comm: Communicator, buf: np.ndarray, root: int, out: np.ndarray | None) -> Any:
    """``comm.broadcast`` that renews broken links and runs again (the root's input is
    only read; every other rank's buffer is written whole by the re-run)."""
    root = buffers.check_root(root, comm.world_size, "broadcast")
    _, dst = buffers.in_out(buf, out, "broadcast", writable=out is None)
    answer = dst if out is None else out
    return _run(comm, "broadcast", lambda: comm._broadcast(buf, root, out), Inputs.kept(dst),
                answer)  # fmt: skip


def reduce_scatter(comm: Communicator, buf: np.ndarray, out: np.ndarray, op: str) -> Any:
    """``comm.reduce_scatter`` that renews broken links and runs again from its input."""

    def replay(src: np.ndarray) -> object:
        return comm._reduce_scatter(src, np.empty_like(out), op)

    inputs = Inputs.of(buf, out, "reduce_scatter")
    attempt = functools.partial(comm._reduce_scatter, buf, out, op)
    return _run(comm, "reduce_scatter", attempt, inputs, out, replay)


def reduce(comm: Communicator, buf: np.ndarray, op: str, root: int, out: np.ndarray | None) -> Any:
    """``comm.reduce`` that renews broken links and runs again from its input (kept while
    the call may write it: in place on any rank, since its algorithm may stage there)."""

    def replay(src: np.ndarray) -> object:
        return comm._reduce(src, op, root, np.empty_like(src))

    inputs = Inputs.of(buf, out, "reduce")
    attempt = functools.partial(comm._reduce, buf, op, root, out)
    return _run(comm, "reduce", attempt, inputs, buf if out is None else out, replay)


def all_to_all(comm: Communicator, buf: np.ndarray, out: np.ndarray) -> Any:
    """``comm.all_to_all`` that renews broken links and runs again from its input."""

    def replay(src: np.ndarray) -> object:
        return comm._all_to_all(src, np.empty_like(out))

    inputs = Inputs.of(buf, out, "all_to_all")
    attempt = functools.partial(comm._all_to_all, buf, out)
    return _run(comm, "all_to_all", attempt, inputs, out, replay)


def barrier(comm: Communicator) -> None:
    """``comm.barrier`` that renews broken links and waits again."""
    _run(comm, "barrier", comm._barrier, Inputs.kept(np.zeros(1, dtype=np.uint8)), None)


def not_rerun(comm: Communicator, call: str, attempt: Callable[[], Any]) -> Any:
    """``attempt()`` of a call a retry does not re-run: a link fault fails it as with retry
    off, and this rank's refusal goes to the agreement, so ranks a call behind or ahead,
    in a call that is re-run, fail at once naming this one instead of at the budget."""
    try:
        return attempt()
    except CommError as exc:
        if retryable(exc):
            refuse(comm, call)
        raise


def closing(comm: Communicator) -> None:
    """``comm``, whose calls retry, closes: where a retried fault reached it between calls
    (the others are in or on their way to its agreement), tell the agreement it will not
    re-run, so they fail at once naming this rank instead of waiting for it until the
    budget."""
    first = comm.failure.first
    if first is not None and first.kind in RETRIED_KINDS:
        refuse(comm, "close")


def refuse(comm: Communicator, call: str) -> None:
    """Write this rank's refusal (its ``call`` is not re-run) into the next epoch's
    agreement, without waiting for the others; a store out of reach is only logged."""
    if comm._retrier is None:
        return
    deadline = time.monotonic() + comm.cfg.retry_budget_s
    ask = Ask(call, comm._calls.completed + 1, comm._kept.seq, 1, deadline)
    try:
        comm._retrier.refuse(comm, ask)
    except CclError as why:  # the error the caller gets is the fault's own
        log.debug("rank %d: could not tell the retry of %s: %s", comm.rank, call, why)


def _run(comm: Communicator, call: str, attempt: Callable[[], Any], inputs: Inputs,
         answer: Any, replay: Replay | None = None) -> Any:  # fmt: skip
    """``attempt()`` until it completes, the links renewed and ``inputs`` restored after
    each retried fault; ``inputs.dst`` is the result every rank holds alike (kept for a
    rank one call behind), ``answer`` what the call returns when a catch-up answered it.
    A call whose result differs by rank gives ``replay`` instead: its input is kept, and
    ``replay(input)`` runs it again for a rank one call behind."""
    first: CommError | None = None
    deadline = 0.0
    tries = 1
    while True:
        try:
            result = attempt()
        except CommError as exc:
            if not retryable(exc):
                raise
            if first is None:
                first, deadline = exc, time.monotonic() + comm.cfg.retry_budget_s
            inputs.restore()  # the input again, whatever happens next
            answered, tries = _recover(comm, call, first, tries + 1, deadline, inputs.dst)
            if answered:
                return answer
            continue
        done = comm._calls.completed  # what ranks a fault leaves behind get of this call:
        if replay is None:
            comm._kept.keep(done, inputs.dst)  # its result
        else:  # its input, as it was before the call wrote over it
            comm._kept.keep_input(done, inputs.src if inputs.saved is None else inputs.saved,
                                  replay)  # fmt: skip
        return result


def _recover(
    comm: Communicator, call: str, first: CommError, attempt: int, deadline: float,
    dst: np.ndarray,
) -> tuple[bool, int]:  # fmt: skip
    """Agree and renew the transport for ``attempt``, then catch up a rank one call behind;
    (True if that answered this rank's call, the attempt it reached). Raises ``first``
    once the budget is spent."""
    calls, kept = comm._calls, comm._kept
    ask = Ask(call, calls.completed + 1, kept.seq, attempt, deadline)
    assert comm._retrier is not None
    try:
        plan = comm._retrier(comm, ask)
        calls.rewind(plan.seq, attempt)
        if plan.replay:
            if ask.pending != plan.seq:  # a rank ahead: seq plan.seq again, with those behind
                kept.run_again()
            return False, attempt
        if plan.root < 0:
            return False, attempt
        behind = ask.pending == plan.seq
        if behind:
            comm._broadcast(dst, plan.root, None)
            return True, attempt
        assert kept.result is not None
        target = kept.result if comm.rank == plan.root else np.empty_like(kept.result)
        comm._broadcast(target, plan.root, None)
        return False, attempt
    except CommError as exc:
        if retryable(exc) and time.monotonic() < deadline:
            return _recover(comm, call, first, attempt + 1, deadline, dst)
        if exc.revocation is not None and not retryable(exc):
            raise exc from first  # the job failed otherwise (a hang, a death): its origin
        raise _exhausted(first, attempt - 1, comm.cfg.retry_budget_s, exc) from exc


def _exhausted(first: CommError, retries: int, budget_s: float, last: CommError) -> CommError:
    """``first`` (the fault's own error, naming its origin) saying the retries gave up."""
    why = last.message.partition(": ")[2] or last.message
    first.message += (
        f"; not recovered by {retries} retr{'y' if retries == 1 else 'ies'} within "
        f"CCLCTL_RETRY_BUDGET={budget_s:g}s (last: {why})"
    )
    first.args = (first.message,)
    first.fields["retries"] = retries
    return first
