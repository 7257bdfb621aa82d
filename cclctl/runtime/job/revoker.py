"""Every rank's end of the job's one revoke record in the store: the path a failure takes to
the ranks that shared memory and the links do not reach.

A rank's first failure is written to the job's ``revoke`` key (first writer wins, so the
job agrees on one origin) and every rank waits on that key with a blocking ``wait`` on a
connection of its own: a rank frozen behind a stopped peer or a blackholed link, or busy
between calls, adopts the record within a store round trip and acknowledges it under
``revoke_ack/<rank>`` (what ``cclctl abort`` reads). A one-sided record (a broken link, a
mismatch) first waits briefly for a better-informed one, and a mismatch is decided by
every witness' observation, so the odd one out is named, not whoever saw it first. A hang
the watchdog expires is named by the diagnosis of the job's live statuses: the rank the
others wait on, not this rank's neighbour.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from cclctl import revocation
from cclctl.errors import CclError, StoreTimeout
from cclctl.records import CollectiveRecord, CommInfo, RankSnapshot
from cclctl.revocation import Revocation
from cclctl.runtime.failure import STORE, FailureState
from cclctl.runtime.job.revoke_end import JobRevokeEnd, Suspect

log = logging.getLogger(__name__)

WEAK_GRACE_S = 0.15  # how long a one-sided record waits for a better-informed one
MISMATCH_WAIT_S = 1.0  # how long the witnesses of a mismatch wait to outvote one call
_NONE = CommInfo([])


class Revoker:
    """Rank ``failure.rank``'s link between its failure state and its job's revoke record,
    through the process's revoke ``end``; ``in_call()`` says which call runs now (for the ack),
    ``publish()`` sends this rank's status, ``dump(reason)`` leaves the evidence."""

    def __init__(
        self,
        end: JobRevokeEnd,
        failure: FailureState,
        *,
        in_call: Callable[[], str] = lambda: "",
        dump: Callable[[str], object] | None = None,
        publish: Callable[[], object] = lambda: None,
        deferred: Callable[[Revocation], bool] = lambda rev: False,
        no_retry: Callable[[], str] = lambda: "",
        carried: Callable[[], Revocation | None] = lambda: None,
    ) -> None:
        """``deferred(record)``: a failure the call recovers from (a retried link fault),
        whose store round trips go to a thread of their own, so an unreachable store
        never holds up the retry; its record stands as this rank saw it. ``no_retry()``:
        why this communicator cannot retry (empty: it can), so an operator's retry
        aborts it instead, naming the operator. ``carried()``: the record this rank's
        documents carry (its communicator's present failure)."""
        self.failure = failure
        self.rank = failure.rank
        self._in_call = in_call
        self._dump = dump
        self._publish = publish
        self._deferred = deferred
        self._no_retry = no_retry
        self._end = end
        self._key = end.key
        self._scoped = self._key.scoped
        self._stopped = end.stopped
        self._last: Revocation | None = None  # the record the end handed on last
        self._serve(failure)
        self._leave = end.follow(self._on_record, carried)

    def _serve(self, failure: FailureState) -> None:
        failure.on_first(self._first)
        failure.on_renew(lambda epoch: self._renew())
        failure.resolve = self.resolve

    def follow(self, failure: FailureState) -> None:
        """Serve ``failure`` from now on: the state of the communicator a shrink built,
        once the job's key no longer holds the failure the shrink got past (see
        :func:`~cclctl.runtime.job.survivors.clear_shrunk_record`), so its own failures,
        an abort and a second shrink go through the store as the first did."""
        self.failure = failure
        self._serve(failure)
        self._renew()

    def _renew(self) -> None:
        """A retry or a shrink began a new life (each clears the key): listen again."""
        self._end.renew()

    # ------------------------------------------------------------------ listening
    def _on_record(self, rev: Revocation) -> None:
        """Adopt the job's record; the end listens again after a retry or a shrink,
        so a later failure, an abort or another ``cclctl retry`` still reaches this rank."""
        if rev != self._last and self._fresh(rev):
            self.failure.adopt(self._as_adopted(rev), STORE)
        self._last = rev

    def _fresh(self, rev: Revocation) -> bool:
        """A record for this communicator's present life (:meth:`Revocation.of_life`)."""
        return rev.of_life(self.failure.comm, self.failure.epoch)

    def _as_adopted(self, rev: Revocation) -> Revocation:
        """An operator's retry where this communicator cannot retry is an abort by them."""
        why = self._no_retry() if rev.kind == "retry" else ""
        if not why:
            return rev
        asked = f"{rev.reason}; " if rev.reason else ""
        return rev.replace(kind="aborted", reason=f"{asked}retry asked, but {why}", not_retried=why)

    # ------------------------------------------------------------------ telling
    def _first(self, rev: Revocation, how: str) -> None:
        """The state's first failure (the peers this rank's transport reaches know by now):
        write it to the store unless it came from there, acknowledge it and publish this
        rank's status with it, all before the call raises, since a rank often exits at once
        and must not take them along (three store round trips); the dump follows on a
        thread of its own. A deferred failure does it all there."""
        if self._deferred(rev):
            threading.Thread(
                target=self._tell, args=(rev, how), name=f"cclctl-revoked-r{self.rank}",
                daemon=True,
            ).start()  # fmt: skip
            return
        self._tell(rev, how)

    def _tell(self, rev: Revocation, how: str) -> None:
        if how != STORE:
            with contextlib.suppress(CclError):
                self.agree(rev)
        with contextlib.suppress(CclError):  # acknowledged even where the agreement failed
            self._ack(self._in_call())
        with contextlib.suppress(Exception):
            self._publish()
        threading.Thread(
            target=self._dump_now, args=(rev,), name=f"cclctl-revoked-r{self.rank}", daemon=True
        ).start()

    def _dump_now(self, rev: Revocation) -> None:
        if self._dump is not None:
            with contextlib.suppress(Exception):
                self._dump(f"revoked: {rev.describe()}")

    def _ack(self, in_call: str) -> None:
        self._key.ack(self.failure.host, in_call)

    def agree(self, rev: Revocation) -> Revocation:
        """Write ``rev`` as the job's record unless one is there; return the one that is."""
        return self._key.agree(rev)

    # ------------------------------------------------------------------ agreeing
    def resolve(self, rev: Revocation) -> Revocation:
        """What this rank's failing call saw, ``rev``, against the job's record: that one
        if it is there (a broken link waits a short grace for it), else ``rev`` agreed; a
        mismatch waits until the witnesses' observations name the odd one out. A deferred
        failure stands as seen, at once."""
        if self._deferred(rev):
            return rev
        try:
            if rev.kind == "mismatch":
                return self._decide_mismatch(rev)
            try:
                if rev.kind in revocation.WEAK_KINDS:
                    self._scoped.wait([revocation.KEY], timeout_s=WEAK_GRACE_S)
                stored = self._key.stored()
                if stored is not None:
                    return stored
            except StoreTimeout:
                pass
            return self.agree(rev)
        except (CclError, ValueError):
            return rev  # the store is gone: the rank's own view stands

    def _decide_mismatch(self, rev: Revocation) -> Revocation:
        """Two ranks alone cannot tell which of them is the odd one: leave this rank's
        observation and wait (at most :data:`MISMATCH_WAIT_S`) for the job's record or for
        observations that outvote one call; then agree on that, or on ``rev``."""
        self._observe(rev)
        deadline = time.monotonic() + MISMATCH_WAIT_S
        while True:
            stored = self._key.stored()
            if stored is not None:
                return stored
            decided = self._odd_one_out(rev)
            if decided is not None:
                return self.agree(decided)
            if time.monotonic() >= deadline:
                return self.agree(self._by_statuses(rev) or rev)
            self._stopped.wait(0.02)

    def _by_statuses(self, rev: Revocation) -> Revocation | None:
        """The odd one out by every rank's published call at ``rev.seq`` (in flight, or
        its last one of that communicator), for when the witnesses' own observations tie
        (two ranks, each blaming the other)."""
        statuses = self._key.statuses().statuses
        calls = {
            rank: f"{r.op}({r.dtype}, count {r.count})"
            for rank, s in statuses.items()
            for r in s.records
            if r.seq == rev.seq and r.comm == rev.comm and r.peer is None
        }
        counts = Counter(calls.values()).most_common()
        if len(counts) < 2 or counts[0][1] == counts[1][1]:
            return self._outvoted_by_completions(rev, statuses)
        common = counts[0][0]
        odd = min(r for r, c in calls.items() if c != common)
        other = min(r for r, c in calls.items() if c == common)
        why = f"called {calls[odd]} where rank {other} called {common}"
        at = {"seq": rev.seq, "op": rev.op, "call": rev.call}
        calls_ = {"called": calls[odd], "peer_called": common}
        return self.failure.record("mismatch", why, odd, peer=other, **calls_, **at)

    def _outvoted_by_completions(
        self, rev: Revocation, statuses: Mapping[int, RankSnapshot]
    ) -> Revocation | None:
        """This rank's call is the odd one when a third rank completed ``rev.seq``: it
        agreed with the others, so the call it matched is the peer's, not this rank's."""
        peer = rev.origin
        done = [
            r
            for r, s in statuses.items()
            if r not in (self.rank, peer)
            and s.comms.get(rev.comm, _NONE).last_completed >= (rev.seq or 0)
        ]
        theirs, mine = rev.called, rev.peer_called
        if not done or not mine:
            return None
        why = f"called {mine} where rank {peer} called {theirs}"
        at = {"seq": rev.seq, "op": rev.op, "call": rev.call, "called": mine, "peer_called": theirs}
        return self.failure.record("mismatch", why, self.rank, peer=peer, **at)

    def _observe(self, rev: Revocation) -> None:
        """Leave what this rank saw of a mismatch: its own call and its peer's."""
        seen = {"rank": self.rank, "peer": rev.origin, "reason": rev.reason, "call": rev.call}
        seen.update(called=rev.called, other=rev.peer, peer_called=rev.peer_called)
        self._scoped.set(f"mismatch/{rev.seq}/{self.rank}", json.dumps(seen).encode())

    def _odd_one_out(self, rev: Revocation) -> Revocation | None:
        """Among every witness' observation of the mismatch at ``rev.seq``, the rank whose
        call differs from the most common one; None while that is not clear."""
        listing = self._scoped.list(f"mismatch/{rev.seq}/")
        calls: dict[int, str] = {}
        for raw in listing.values():
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                seen = json.loads(raw)
                calls[int(seen["peer"])] = str(seen["called"])
                calls[int(seen["other"])] = str(seen["peer_called"])
        counts = Counter(calls.values())
        if len(counts) < 2:
            return None
        (common, n), *rest = counts.most_common()
        if rest and rest[0][1] == n:
            return None  # a tie: nobody can be named the odd one yet
        odd = sorted(r for r, c in calls.items() if c != common)
        if odd[0] == rev.origin:
            return rev
        other = min(r for r, c in calls.items() if c == common)
        why = f"called {calls[odd[0]]} where rank {other} called {common}"
        return self.failure.record(
            "mismatch", why, odd[0], seq=rev.seq, op=rev.op, call=rev.call, peer=other,
            called=calls[odd[0]], peer_called=common,
        )  # fmt: skip

    def hang_origin(self, rec: CollectiveRecord, fallback: Revocation) -> Revocation:
        """The watchdog expired ``rec``: the job's record if there is one, else the rank the
        hang waits on as the diagnosis of the live statuses names it, asked again for a
        status interval or two (:meth:`JobRevokeEnd.name_hang`: only the first rank to
        expire the call diagnoses it), else ``fallback`` (this rank's own peer), agreed with
        the other ranks."""
        hang = f"{rec.comm}/{self.failure.epoch}/{rec.op}/{rec.seq}"
        try:
            named = self._end.name_hang(lambda found, _: self._suspected(rec, found), hang)
            return named or self.agree(fallback)
        except (CclError, ValueError):
            return fallback

    def _suspected(self, rec: CollectiveRecord, found: Suspect) -> Revocation:
        rank, kind, reason, peer, symptom = found
        return self.failure.record(
            kind, reason, rank, seq=rec.seq, op=rec.op, call=rec.op, via="watchdog", peer=peer,
            symptom=symptom,
        )  # fmt: skip

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Stop following the job's record (the end is the agent's, which closes it)."""
        self._leave()
