"""``CCLCTL_RETRY_BUDGET``: a collective that a broken or stalled TCP link interrupted runs again.

Every rank of the communicator abandons the attempt (the failure state spreads it as any
failure), they agree in the job's store that the call is retried, the transport is renewed
under the next epoch (:mod:`cclctl.runtime.job.retry`), and the call runs again from its
input: an in-place call keeps a copy of its input while retry is on, so a partly reduced
buffer is never reduced twice and the result is the one a fault-free run gives.

Every collective re-runs (:data:`RERUNS`). A fault can leave the ranks calls apart (a run
of broadcasts lets the ranks upstream of a cut link finish calls the ranks downstream never
got): each seq the ranks ahead completed and others did not is caught up in order, on the
new links: where its result is the same on every rank (:data:`SHARED`: all_reduce,
all_gather, broadcast, barrier) the ranks behind receive it from the lowest rank ahead
(a broadcast at that seq, from what it kept: :class:`~.rerun.Kept`); where it differs by
rank (reduce_scatter, reduce, all_to_all) the ranks ahead run it once more from a copy of
its input, with the ranks behind, and drop what it gives them. A rank behind returns from
its call and meets the next seqs the same way as its program makes them (the agreed
:class:`Plan` says how each catches up); then every rank re-runs the highest seq. A call
that ends with a confirm (:class:`~.rerun.Ending`: 1 MiB or more of the common
collectives) keeps nothing: no rank completes it before every rank's result is whole, so
the ranks behind it are inside it, holding their result, and return it (:data:`HELD`). A rank
that closes with retry on waits for the others to close, and serves a retry meanwhile
(:func:`closing`). Past the budget, counted from the first fault of the call, every
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
from cclctl.runtime.comm.rerun import SYNCING, Ending, Form, Inputs, Replay

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
#: How long a closing rank waits on the store between looks at its failure state.
AGREE_WAIT_S = 0.25


@dataclasses.dataclass(frozen=True)
class Ask:
    """What a rank brings to a retry: the call it was in, the collective seq it has not
    completed (``pending``), the seqs of the calls it kept (:class:`~.rerun.Kept`: from
    ``kept_from`` to ``kept``, their ops in ``kept_ops``), its attempt number and the
    budget's deadline (``time.monotonic()``); ``done``: ``pending`` where its call's result
    is whole here (it failed in the call's confirm), else 0."""

    call: str
    pending: int
    kept: int
    attempt: int
    deadline: float
    kept_from: int = 0
    kept_ops: str = ""
    done: int = 0


#: A catch-up seq whose result differs by rank: the ranks ahead run it again from its
#: kept input, with the ranks behind.
REPLAY = -1
#: A catch-up seq that ended with a confirm (:class:`~.rerun.Ending`): the ranks behind,
#: still inside it, hold their whole result and return it; nothing moves.
HELD = -2
#: The ``algo`` of the record that closes a :data:`HELD` seq on every rank (nothing runs).
HELD_ALGO = "held"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every rank agreed: the calls open again from seq ``seq``. Each seq from there
    below :attr:`rerun` is one the ranks ahead completed and the ranks behind did not:
    ``roots[i]`` is the rank whose kept result of seq ``seq + i`` the ranks behind take (a
    broadcast), or :data:`REPLAY`: the ranks ahead run it again from its kept input, with
    the ranks behind, or :data:`HELD`: the ranks behind return what they hold. Then every
    rank re-runs seq :attr:`rerun` (a rank closing there has no call to re-run, and goes
    on closing)."""

    seq: int
    roots: tuple[int, ...] = ()

    @property
    def rerun(self) -> int:
        return self.seq + len(self.roots)

    def step(self, seq: int) -> int | None:
        """How seq ``seq`` catches up (a root, or :data:`REPLAY`); None: it is no catch-up."""
        i = seq - self.seq
        return self.roots[i] if 0 <= i < len(self.roots) else None


class Retrier(Protocol):
    """The job's side of a retry (:class:`cclctl.runtime.job.retry.Retry`)."""

    def __call__(self, comm: Communicator, ask: Ask) -> Plan:
        """Agree with every rank and renew the transport; raises :class:`CommError` when
        that cannot be done within the deadline."""

    def refuse(self, comm: Communicator, ask: Ask) -> None:
        """Tell the agreement, without waiting, that this rank's call is not re-run."""

    def all_closed(self, comm: Communicator, ask: Ask, wait_s: float) -> bool:
        """Say this rank is closing (after ``ask.pending - 1``) and wait up to ``wait_s``
        for every rank to say so; True once all have."""

    def leave(self, comm: Communicator, ask: Ask) -> None:
        """Say this rank closed for good: a retry that needs it fails at once, naming it."""


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
    inputs = Inputs.of(buf, out, spare=comm._kept)
    answer = inputs.dst if out is None else out
    ending = Ending.of("all_reduce", inputs.src.nbytes, inputs.src.dtype)
    attempt = functools.partial(comm._all_reduce, buf, op, out, ending)
    return _run(comm, "all_reduce", attempt, inputs, answer, ending=ending)


def all_gather(comm: Communicator, buf: np.ndarray, out: np.ndarray) -> Any:
    """``comm.all_gather`` that renews broken links and runs again (its input is never
    written: ``buf`` is disjoint from ``out`` or already this rank's slot of it)."""
    _, dst, _ = buffers.gather_args(buf, out, comm.world_size, comm.rank)
    ending = Ending.of("all_gather", dst.nbytes, dst.dtype)
    attempt = functools.partial(comm._all_gather, buf, out, ending)
    return _run(comm, "all_gather", attempt, Inputs.kept(dst), out, ending=ending)


def broadcast(comm: Communicator, buf: np.ndarray, root: int, out: np.ndarray | None) -> Any:
    """``comm.broadcast`` that renews broken links and runs again (the root's input is
    only read; every other rank's buffer is written whole by the re-run)."""
    root = buffers.check_root(root, comm.world_size, "broadcast")
    _, dst = buffers.in_out(buf, out, "broadcast", writable=out is None)
    answer = dst if out is None else out
    ending = Ending.of("broadcast", dst.nbytes, dst.dtype)
    attempt = functools.partial(comm._broadcast, buf, root, out, ending)
    return _run(comm, "broadcast", attempt, Inputs.kept(dst), answer, ending=ending)


def reduce_scatter(comm: Communicator, buf: np.ndarray, out: np.ndarray, op: str) -> Any:
    """``comm.reduce_scatter`` that renews broken links and runs again from its input."""

    def replay(src: np.ndarray) -> object:
        return comm._reduce_scatter(src, np.empty_like(out), op)

    inputs = Inputs.of(buf, out, "reduce_scatter", spare=comm._kept)
    ending = Ending.of("reduce_scatter", inputs.src.nbytes, inputs.src.dtype)
    attempt = functools.partial(comm._reduce_scatter, buf, out, op, ending)
    return _run(comm, "reduce_scatter", attempt, inputs, out, replay, ending)


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
            comm._retry_gave_up = True
            refuse(comm, call)
        raise


def closing(comm: Communicator) -> None:
    """``comm``, whose calls retry, closes. A rank behind may still need what this rank
    kept of its completed calls (a run of broadcasts lets the root finish while a rank
    downstream of a cut link is calls behind), so the rank waits, up to the budget, until
    every rank closes; a link fault that reaches it meanwhile (or before) is retried with
    this rank serving the calls the others lack. If it gives up (another failure, the
    budget, or its own call's retry that failed), it says so in the store, so a retry
    that needs it fails at once, naming it, instead of waiting for it until the budget."""
    retrier = comm._retrier
    if retrier is None:
        return
    budget = comm.cfg.retry_budget_s
    deadline = time.monotonic() + budget
    tries = 1
    try:
        while not comm._retry_gave_up and time.monotonic() < deadline:
            first = comm.failure.first
            if first is not None and first.kind not in RETRIED_KINDS:
                break  # the job failed otherwise: nothing here will be retried
            if first is not None:
                own = comm._calls.completed + 1
                fault = comm.failure.error(first, f"rank {comm.rank}: close")
                tries = _recover(comm, "close", own, fault, tries + 1, deadline, None)[1]
                continue
            if retrier.all_closed(comm, _ask(comm, "close", 1, deadline), AGREE_WAIT_S):
                return
    except CclError as why:
        log.info("rank %d: closed without serving a retry: %s", comm.rank, why)
    try:
        retrier.leave(comm, _ask(comm, "close", 1, deadline))
    except CclError as why:
        log.debug("rank %d: could not tell the retry it left: %s", comm.rank, why)


def _ask(comm: Communicator, call: str, attempt: int, deadline: float,
         pending: int | None = None, done: bool = False) -> Ask:  # fmt: skip
    """This rank's entry: ``call`` at ``pending`` (default: after its last completed);
    ``done``: its result is whole here."""
    kept = comm._kept
    own = comm._calls.completed + 1 if pending is None else pending
    return Ask(call, own, kept.seq, attempt, deadline, kept.oldest, kept.ops(), own if done else 0)


def refuse(comm: Communicator, call: str) -> None:
    """Write this rank's refusal (its ``call`` is not re-run) into the next epoch's
    agreement, without waiting for the others; a store out of reach is only logged."""
    if comm._retrier is None:
        return
    deadline = time.monotonic() + comm.cfg.retry_budget_s
    try:
        comm._retrier.refuse(comm, _ask(comm, call, 1, deadline))
    except CclError as why:  # the error the caller gets is the fault's own
        log.debug("rank %d: could not tell the retry of %s: %s", comm.rank, call, why)


def _run(
    comm: Communicator, call: str, attempt: Callable[[], Any], inputs: Inputs, answer: Any,
    replay: Replay | None = None, ending: Ending | None = None,
) -> Any:  # fmt: skip
    """``attempt()`` until it completes, the links renewed and ``inputs`` restored after
    each retried fault; ``inputs.dst`` is the result every rank holds alike (kept for
    ranks behind), ``answer`` what the call returns when a catch-up answered it. A call
    whose result differs by rank gives ``replay`` instead: its input is kept, and
    ``replay(input)`` runs it again for ranks behind. A call that ranks ahead completed
    before a retry agreed (this rank was behind) takes their result where it is alike.
    ``ending``: how the call ends (the attempt calls it): one that ends with a confirm keeps
    nothing, and a fault in its confirm leaves its result whole here, which this rank
    returns where another rank completed the call (else its input is restored, and it
    re-runs)."""
    own = comm._calls.completed + 1  # the seq this call opens at
    ending = Ending(False) if ending is None else ending
    first: CommError | None = None
    deadline = 0.0
    tries = 1
    try:
        while True:
            plan = comm._catchup
            root = None if plan is None else plan.step(own)
            try:
                if root is not None and root >= 0:  # ranks ahead completed it: their result
                    comm._broadcast(inputs.dst, root, None)
                    _keep(comm, call, own, inputs, None, False)
                    return answer
                result = attempt()
            except CommError as exc:
                if not retryable(exc):
                    raise
                if first is None:
                    first, deadline = exc, time.monotonic() + comm.cfg.retry_budget_s
                if not ending.done:
                    inputs.restore()  # the input again, whatever happens next
                try:
                    answered, tries = _recover(comm, call, own, first, tries + 1, deadline,
                                               inputs.dst, ending.done, ending.form)  # fmt: skip
                except CommError:
                    comm._retry_gave_up = True  # its close must not wait to serve a retry
                    if ending.done:
                        inputs.restore()  # the input, as after any failed call
                    raise
                if answered:
                    if ending.done:  # a rank ahead completed it: the result here is whole
                        comm._kept.hold(own, call, ending.form)
                    else:
                        _keep(comm, call, own, inputs, None, False)
                    return answer
                if ending.done:  # nobody completed it: every rank runs it again
                    inputs.restore()
                    ending.done = False
                continue
            if ending.confirm:
                comm._kept.hold(own, call, ending.form)
            else:
                _keep(comm, call, own, inputs, replay, inputs.src.size > 0)
            return result
    finally:
        comm._kept.give_back(inputs.saved)


def _keep(comm: Communicator, call: str, seq: int, inputs: Inputs, replay: Replay | None,
          ran: bool) -> None:  # fmt: skip
    """Keep what ranks a fault leaves behind need of this completed call: its result, or
    its input as it was before the call wrote over it. ``ran``: its algorithm ran here
    with data (so a call of :data:`~.rerun.SYNCING` tells every rank entered it)."""
    kept = comm._kept
    if replay is None:
        kept.keep(seq, inputs.dst, call, synced=ran and call in SYNCING)
    else:
        src = inputs.src if inputs.saved is None else inputs.saved
        kept.keep_input(seq, src, replay, call, synced=ran and call in SYNCING)


def _recover(
    comm: Communicator, call: str, own: int, first: CommError, attempt: int, deadline: float,
    dst: np.ndarray | None, done: bool = False, form: Form | None = None,
) -> tuple[bool, int]:  # fmt: skip
    """Agree and renew the transport for ``attempt`` of this rank's call at seq ``own``,
    then catch up the ranks behind; (True if that answered this rank's call, the attempt
    it reached). ``done``: the call's result is whole here (a fault in its confirm), and
    ``form`` its size.
    Raises ``first`` once the budget is spent."""
    calls = comm._calls
    ask = _ask(comm, call, attempt, deadline, own, done)
    assert comm._retrier is not None
    try:
        plan = comm._retrier(comm, ask)
        comm._catchup = plan
        calls.rewind(plan.seq, attempt)
        serve(comm, plan, min(own, plan.rerun))  # the seqs this rank completed, others not
        if own < plan.rerun:  # behind: this call is one the ranks ahead completed
            root = plan.step(own)
            if root == HELD:  # it ended with a confirm that a rank passed: whole here
                _held(comm, call, form)
                return True, attempt
            if root is not None and root >= 0 and dst is not None:
                comm._broadcast(dst, root, None)
                return True, attempt
            return False, attempt  # it runs again, the ranks ahead replaying theirs
        return False, attempt
    except CommError as exc:
        if retryable(exc) and time.monotonic() < deadline:
            return _recover(comm, call, own, first, attempt + 1, deadline, dst, done, form)
        if exc.revocation is not None and not retryable(exc):
            raise exc from first  # the job failed otherwise (a hang, a death): its origin
        raise _exhausted(first, attempt - 1, comm.cfg.retry_budget_s, exc) from exc


def serve(comm: Communicator, plan: Plan, stop: int) -> None:
    """Run each catch-up seq below ``stop`` (those this rank completed and a rank behind
    did not) with the ranks behind, from what this rank kept: a broadcast of the kept
    result (from the plan's root, the others dropping what they receive), or the call
    again from its kept input; nothing for a call that ended with a confirm."""
    for seq in range(plan.seq, stop):
        kept, root = comm._kept.get(seq), plan.step(seq)
        assert kept is not None and root is not None  # the plan checked every rank keeps it
        if root == HELD:
            _held(comm, kept.op, kept.form)
            continue
        assert kept.data is not None
        if root == REPLAY:
            kept.run_again()
        elif root == comm.rank:
            comm._broadcast(kept.data, root, None)
        else:
            comm._broadcast(np.empty_like(kept.data), root, None)


def _held(comm: Communicator, call: str, form: Form | None) -> None:
    """Close the :data:`HELD` seq the calls are at, here, with a record of its own (of the
    call's ``form``, as every rank's first one said): every rank's seqs stay aligned, and
    the diagnosis sees it completed in the new epoch."""
    dtype, count, nbytes = (np.dtype(np.uint8), 0, 0) if form is None else form
    with comm._call(call, np.empty(0, dtype), HELD_ALGO, count=count, nbytes=nbytes):
        pass


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
