"""The job's revoke record from a torch rank's side: one origin for a hang or a death.

cclctl's runtime raises a revoked call itself; under torch it cannot (gloo and NCCL raise
their own errors), so here the record annotates: a rank whose watchdog expires a call names
the rank the hang waits on (the live diagnosis of the job's statuses, as the runtime's
watchdog does), a rank whose call fails because a peer's connection closed names the peer
whose process is gone on this host, and either writes the job's ``revoke`` key (first
writer wins, :mod:`cclctl.revocation`). Every rank listens on that key with a connection of
its own and carries the record it adopted in its statuses and dumps, so ``cclctl diagnose
hang`` names one origin, live and post-mortem. A torch job can outlive a hang (the rank it
waited on comes back): a ``hang`` record is withdrawn once its call completes here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence

from cclctl.endings import ENDING_TERMINATED
from cclctl.errors import CclError
from cclctl.live.snapshot import JobStatuses
from cclctl.records import CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.runtime.job.revoke_end import JobRevokeEnd
from cclctl.runtime.peer_process import PEER_EXIT_GRACE_S, exit_reason, first_gone
from cclctl.telemetry.hub import Telemetry

log = logging.getLogger("cclctl.torch")


#: The signals a launcher stops a job with (its ranks' exits by them are not faults).
TEARDOWN = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})

#: What gloo (and NCCL's socket layer) says when a peer's end of a connection went away.
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe")


def peer_gone(error: str) -> bool:
    """True if torch's error text says a peer's connection closed or was reset."""
    text = error.lower()
    return any(words in text for words in PEER_GONE)


class TorchRevoke:
    """The torch front end of rank ``telemetry.rank``'s revoke ``end`` (the agent's, shared
    with ``cclctl.init()``'s communicators in the same process): what torch's calls say of
    the job's failure, and the record this rank adopted."""

    def __init__(
        self, end: JobRevokeEnd, telemetry: Telemetry, peers: Sequence[tuple[str, int]] = ()
    ) -> None:
        """``peers``: every rank's (host, pid), by rank, as the rendezvous has them."""
        self.telemetry = telemetry
        self.rank = telemetry.rank
        self.peers = peers
        self.record: Revocation | None = None  # the record this rank adopted
        self._lock = threading.Lock()
        self._end = end
        #: adopts the record another rank writes; after a withdrawn hang, the end listens again
        self._leave = end.follow(self.adopt, lambda: self.record)

    # ------------------------------------------------------------------ naming
    def on_hang(self, rec: CollectiveRecord) -> Revocation | None:
        """The watchdog expired ``rec``: adopt the job's record, or the one the live
        diagnosis names (None: it names nobody yet, or the store does not answer)."""
        try:
            found = self._end.name_hang(
                lambda found, statuses: self._suspected(rec, *found, statuses),
                f"{rec.comm}/{rec.op}/{rec.seq}",
            )
            return None if found is None else self.adopt(found)
        except (CclError, ValueError) as exc:
            log.warning("cclctl: no origin for the hang: %s", exc)
            return None

    def on_failed(self, rec: CollectiveRecord, error: str) -> Revocation | None:
        """``rec`` failed with torch's ``error``: when it says a peer's connection went
        away and a rank's process on this host is gone, that rank died: adopt the job's
        record, or write that death as it."""
        if self.record is not None or not peer_gone(error):
            return self.record
        return self._name_death(rec, "call")

    def on_stopped(self, rec: CollectiveRecord | None) -> Revocation | None:
        """The launcher stops this rank (a SIGTERM; ``rec``: its call in flight, if any).
        torchrun stops every worker once it sees one gone, often before a survivor's call
        failed: a rank's process gone on this host died first, so adopt the job's record
        or write that death as it, seen by this rank via the launcher."""
        if self.record is not None:
            return self.record
        return self._name_death(rec, "launcher")

    def _name_death(self, rec: CollectiveRecord | None, via: str) -> Revocation | None:
        try:
            found = self._end.stored() or self._dead_peer(rec, via)
            return None if found is None else self.adopt(self._end.agree(found))
        except (CclError, ValueError) as exc:
            log.warning("cclctl: no origin for the failure: %s", exc)
            return None

    def completed(self, rec: CollectiveRecord) -> None:
        """``rec`` completed: a hang record of its call (or an earlier one) is over."""
        record = self.record
        if record is None or record.kind != "hang" or record.comm != rec.comm:
            return
        if record.seq is None or rec.peer is not None or rec.seq < record.seq:
            return
        with self._lock:
            if self.record is not record:
                return
            self.record = None
        with contextlib.suppress(CclError):
            self._end.withdraw(record)
        self._end.renew()
        log.warning("cclctl: the hang at %s of comm %s is over", record.at(), record.comm)

    def adopt(self, record: Revocation) -> Revocation:
        """Carry ``record`` in this rank's documents from now on: publish and dump at once
        (a rank blocked in gloo when its launcher stops it leaves no dump of its own)."""
        with self._lock:
            if self.record == record:
                return record
            self.record = record
        self.telemetry.publish_now()
        log.error("cclctl: the job's failure: %s", record.describe())
        try:
            self.telemetry.dump("revoked")
        except Exception as exc:
            log.warning("cclctl: no dump of the job's failure: %s", exc)
        return record

    # ------------------------------------------------------------------ naming it
    def _suspected(
        self,
        rec: CollectiveRecord,
        origin: int,
        kind: str,
        reason: str,
        peer: int | None,
        symptom: str,
        statuses: JobStatuses,
    ) -> Revocation:
        """The record of the diagnosis' suspect of the hang at ``rec``."""
        record = self._record(kind, reason, origin, rec, "watchdog", peer=peer, symptom=symptom)
        snap = statuses.statuses.get(origin)
        return record if snap is None else record.replace(host=snap.host, pid=snap.pid)

    def _dead_peer(self, rec: CollectiveRecord | None, via: str = "call") -> Revocation | None:
        """The first rank on this host whose process is gone, or goes within
        :data:`PEER_EXIT_GRACE_S` (its sockets close before it turns zombie): one that died
        without a word (killed) before one that said why (an uncaught error), lower ranks
        first. A rank the launcher stopped (its status says SIGTERM, or its exit does) did
        not die first: the launcher stops every rank once one is gone. A rank of this host
        whose status the store does not hold yet (its host agent has not written its first
        document) is looked at by its pid at the rendezvous."""
        host = self.telemetry.cfg.hostname
        statuses = self._end.key.statuses().statuses
        local = {
            snap.pid: (bool(snap.reason), rank)
            for rank, snap in statuses.items()
            if rank != self.rank
            and snap.host == host
            and not snap.finished
            and snap.ending != ENDING_TERMINATED
            and exit_reason(snap.pid) not in TEARDOWN
        }
        unseen = (
            (rank, pid)
            for rank, (where, pid) in enumerate(self.peers)
            if rank != self.rank and rank not in statuses and where == host and pid > 0
        )
        for rank, pid in unseen:
            if exit_reason(pid) not in TEARDOWN:
                local.setdefault(pid, (False, rank))
        found = first_gone(sorted(local, key=local.__getitem__), PEER_EXIT_GRACE_S)
        if found is None or found[1] in TEARDOWN:
            return None
        pid, reason = found
        record = self._record("died", reason, local[pid][1], rec, via)
        return record.replace(host=host, pid=pid)

    def _record(
        self,
        kind: str,
        reason: str,
        origin: int,
        rec: CollectiveRecord | None,
        via: str,
        **more: object,
    ) -> Revocation:
        return Revocation(
            kind=kind,
            origin=origin,
            reason=reason,
            comm="" if rec is None else rec.comm,
            seq=None if rec is None else rec.seq,
            op=None if rec is None else rec.op,
            seen_by=self.rank,
            via=via,
            **more,  # type: ignore[arg-type]
        )

    def close(self) -> None:
        """Stop following the job's record (the end is the agent's, which closes it)."""
        self._leave()
