"""``CCLCTL_RETRY_BUDGET``: a collective that a broken or stalled TCP link interrupted runs again.

Every rank of the communicator abandons the attempt (the failure state spreads it as any
failure), they agree in the job's store that the call is retried (what they agree on:
:mod:`~.retry_rules`), the transport is renewed under the next epoch
(:mod:`cclctl.runtime.job.retry`), and the call runs again from its input: an in-place call
keeps a copy of its input while retry is on (:mod:`~.rerun_inputs`), so a partly reduced
buffer is never reduced twice and the result is the one a fault-free run gives.

Every collective re-runs (:data:`~.retry_rules.RERUNS`). A fault can leave the ranks calls
apart (a run of broadcasts lets the ranks upstream of a cut link finish calls the ranks
downstream never got): each seq the ranks ahead completed and others did not is caught up
in order, on the new links: where its result is the same on every rank
(:data:`~.retry_rules.SHARED`: all_reduce, all_gather, broadcast, barrier) the ranks behind
receive it from the lowest rank ahead (a broadcast at that seq, from what it kept:
:class:`~cclctl.runtime.comm.rerun.Kept`); where it differs by rank (reduce_scatter,
reduce, all_to_all, all_to_allv) the ranks ahead run it once more from a copy of its
input, with the ranks behind, and drop what it gives them. A rank behind returns from its
call and meets the next seqs the same way as its program makes them (the agreed
:class:`~.retry_rules.Plan` says how each catches up; :mod:`~.retry_catchup` runs it); then
every rank re-runs the highest seq. A call that ends with a confirm
(:class:`~cclctl.runtime.comm.rerun.Ending`: 1 MiB or more of the common collectives)
keeps nothing: no rank completes it before every rank's result is whole, so the ranks
behind it are inside it, holding their result, and return it (:data:`~.retry_rules.HELD`).
A rank that closes with retry on waits for the others to close, and serves a retry
meanwhile (:meth:`Retrying.closing`). Past the budget, counted from the first fault of the
call, every rank raises that fault's error (naming its origin), with its in-place buffer
holding the input again. Point-to-point calls are not re-run: a link fault fails them as
with retry off, and the rank's refusal goes to the next epoch's agreement
(:meth:`Retrying.not_rerun`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from cclctl.errors import CclError, CommError
from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.port import Port
from cclctl.runtime.comm.recovery.rerun_inputs import Rerun, prepare
from cclctl.runtime.comm.recovery.retry_catchup import close_held, serve
from cclctl.runtime.comm.recovery.retry_rules import (
    AGREE_WAIT_S,
    HELD,
    RERUNS,
    RETRIED_KINDS,
    Ask,
    Plan,
    Retrier,
    retryable,
)
from cclctl.runtime.comm.rerun import SYNCING, Ending, Form, Inputs, Replay

log = logging.getLogger("cclctl.runtime")


@dataclasses.dataclass
class _Faults:
    """A call's faults so far: the first (the error it raises past the budget), the
    budget's deadline counted from it, and the attempt reached."""

    first: CommError | None = None
    deadline: float = 0.0
    tries: int = 1


class Retrying:
    """The retry policy of one communicator (``port``), with the job's side of the
    agreement (``retrier``)."""

    def __init__(self, port: Port, retrier: Retrier) -> None:
        self.port = port
        self.retrier = retrier
        #: the last retry's plan: the calls a rank behind takes from the ranks ahead
        self.catchup: Plan | None = None
        #: a call's retry failed here: the communicator's close serves no retry
        self.gave_up = False

    def run(self, call: Call) -> Any:
        """``call`` until it completes, re-run after each link fault within the budget;
        a point-to-point call is not re-run (:meth:`not_rerun`)."""
        if call.op not in RERUNS:
            return self.not_rerun(call)
        return self._run(prepare(self.port, call))

    def _run(self, r: Rerun) -> Any:
        """Attempts of ``r`` until one completes, the links renewed and its input restored
        after each retried fault."""
        own = self.port.completed + 1  # the seq this call opens at
        ending = Ending(False) if r.ending is None else r.ending
        faults: _Faults | None = None  # made at the first fault: none made without one
        try:
            while True:
                try:
                    return self._once(r, own, ending)
                except CommError as exc:
                    if not retryable(exc):
                        raise
                    faults = faults or _Faults()
                    if self._ride_out(r, own, ending, exc, faults):
                        return r.answer
        finally:
            self.port.kept.give_back(r.inputs.saved)

    def _once(self, r: Rerun, own: int, ending: Ending) -> Any:
        """One attempt at seq ``own``, or, where the ranks ahead completed it (this rank was
        behind), their result where it is alike; what this rank keeps of it then."""
        port = self.port
        root = None if self.catchup is None else self.catchup.step(own)
        if root is not None and root >= 0:
            port.attempt(Call.broadcast(r.inputs.dst, root))
            self._keep(r.call.op, own, r.inputs, None, False)
            return r.answer
        result = port.attempt(r.call, r.ending)
        if ending.confirm:
            port.kept.hold(own, r.call.op, ending.form)
        else:
            self._keep(r.call.op, own, r.inputs, r.replay, r.inputs.src.size > 0)
        return result

    def _ride_out(
        self, r: Rerun, own: int, ending: Ending, exc: CommError, faults: _Faults
    ) -> bool:
        """Recover from ``exc`` (a retried fault) for the call at seq ``own``: True where
        that answered it; False: it runs again. A call that ends with a confirm and failed
        in it has its result whole here: it returns it where another rank completed the
        call (else its input is restored, and it re-runs)."""
        inputs = r.inputs
        if faults.first is None:
            faults.first = exc
            faults.deadline = time.monotonic() + self.port.cfg.retry_budget_s
        if not ending.done:
            inputs.restore()  # the input again, whatever happens next
        try:
            answered, faults.tries = self.recover(
                r.call.op, own, faults.first, faults.tries + 1, faults.deadline, inputs.dst,
                ending.done, ending.form,
            )  # fmt: skip
        except CommError:
            self.gave_up = True  # its close must not wait to serve a retry
            if ending.done:
                inputs.restore()  # the input, as after any failed call
            raise
        if answered:
            if ending.done:  # a rank ahead completed it: the result here is whole
                self.port.kept.hold(own, r.call.op, ending.form)
            else:
                self._keep(r.call.op, own, inputs, None, False)
            return True
        if ending.done:  # nobody completed it: every rank runs it again
            inputs.restore()
            ending.done = False
        return False

    def _keep(self, call: str, seq: int, inputs: Inputs, replay: Replay | None,
              ran: bool) -> None:  # fmt: skip
        """Keep what ranks a fault leaves behind need of this completed call: its result, or
        its input as it was before the call wrote over it. ``ran``: its algorithm ran here
        with data (so a call of :data:`~.rerun.SYNCING` tells every rank entered it)."""
        kept = self.port.kept
        if replay is None:
            kept.keep(seq, inputs.dst, call, synced=ran and call in SYNCING)
        else:
            src = inputs.src if inputs.saved is None else inputs.saved
            kept.keep_input(seq, src, replay, call, synced=ran and call in SYNCING)

    def recover(
        self, call: str, own: int, first: CommError, attempt: int, deadline: float,
        dst: np.ndarray | None, done: bool = False, form: Form | None = None,
    ) -> tuple[bool, int]:  # fmt: skip
        """Agree and renew the transport for ``attempt`` of this rank's call at seq ``own``,
        then catch up the ranks behind; (True if that answered this rank's call, the attempt
        it reached). ``done``: the call's result is whole here (a fault in its confirm), and
        ``form`` its size. Raises ``first`` once the budget is spent."""
        port = self.port
        ask = self._ask(call, attempt, deadline, own, done)
        try:
            plan = self.retrier(port, ask)
            self.catchup = plan
            port.rewind(plan.seq, attempt)
            serve(port, plan, min(own, plan.rerun))  # the seqs this rank completed, others not
            if own >= plan.rerun:
                return False, attempt
            root = plan.step(own)  # behind: this call is one the ranks ahead completed
            if root == HELD:  # it ended with a confirm that a rank passed: whole here
                close_held(port, call, form)
                return True, attempt
            if root is not None and root >= 0 and dst is not None:
                port.attempt(Call.broadcast(dst, root))
                return True, attempt
            return False, attempt  # it runs again, the ranks ahead replaying theirs
        except CommError as exc:
            if retryable(exc) and time.monotonic() < deadline:
                return self.recover(call, own, first, attempt + 1, deadline, dst, done, form)
            if exc.revocation is not None and not retryable(exc):
                raise exc from first  # the job failed otherwise (a hang, a death): its origin
            raise _exhausted(first, attempt - 1, port.cfg.retry_budget_s, exc) from exc

    def not_rerun(self, call: Call) -> Any:
        """One attempt of a call a retry does not re-run: a link fault fails it as with
        retry off, and this rank's refusal goes to the agreement, so ranks a call behind or
        ahead, in a call that is re-run, fail at once naming this one instead of at the
        budget."""
        try:
            return self.port.attempt(call)
        except CommError as exc:
            if retryable(exc):
                self.gave_up = True
                self.refuse(call.op)
            raise

    def refuse(self, call: str) -> None:
        """Write this rank's refusal (its ``call`` is not re-run) into the next epoch's
        agreement, without waiting for the others; a store out of reach is only logged."""
        deadline = time.monotonic() + self.port.cfg.retry_budget_s
        try:
            self.retrier.refuse(self.port, self._ask(call, 1, deadline))
        except CclError as why:  # the error the caller gets is the fault's own
            log.debug("rank %d: could not tell the retry of %s: %s", self.port.rank, call, why)

    def closing(self) -> None:
        """The communicator closes. A rank behind may still need what this rank kept of its
        completed calls (a run of broadcasts lets the root finish while a rank downstream of
        a cut link is calls behind), so the rank waits, up to the budget, until every rank
        closes; a link fault that reaches it meanwhile (or before) is retried with this rank
        serving the calls the others lack. If it gives up (another failure, the budget, or
        its own call's retry that failed), it says so in the store, so a retry that needs
        it fails at once, naming it, instead of waiting for it until the budget."""
        port, retrier = self.port, self.retrier
        deadline = time.monotonic() + port.cfg.retry_budget_s
        tries = 1
        try:
            while not self.gave_up and time.monotonic() < deadline:
                first = port.failure.first
                if first is not None and first.kind not in RETRIED_KINDS:
                    break  # the job failed otherwise: nothing here will be retried
                if first is not None:
                    own = port.completed + 1
                    fault = port.failure.error(first, f"rank {port.rank}: close")
                    tries = self.recover("close", own, fault, tries + 1, deadline, None)[1]
                    continue
                if retrier.all_closed(port, self._ask("close", 1, deadline), AGREE_WAIT_S):
                    return
        except CclError as why:
            log.info("rank %d: closed without serving a retry: %s", port.rank, why)
        try:
            retrier.leave(port, self._ask("close", 1, deadline))
        except CclError as why:
            log.debug("rank %d: could not tell the retry it left: %s", port.rank, why)

    def _ask(self, call: str, attempt: int, deadline: float, pending: int | None = None,
             done: bool = False) -> Ask:  # fmt: skip
        """What this rank brings to the retry of ``call`` (at seq ``pending``, by default the
        one after its last completed call)."""
        kept = self.port.kept
        own = self.port.completed + 1 if pending is None else pending
        return Ask(
            call, own, kept.seq, attempt, deadline, kept.oldest, kept.ops(), own if done else 0
        )


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
