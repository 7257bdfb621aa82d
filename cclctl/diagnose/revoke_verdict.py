"""The verdict one revoke record says: its origin and kind, in words, with a next step.

``died`` makes the origin rank ``dead`` (with the reason), ``link`` the link, ``mismatch``
the mismatched rank, ``error`` the rank that failed, a ``hang`` the verdict the watchdog
named its origin from (:data:`HANG_REASONS`), and an operator's abort or retry ``aborted``,
blaming no rank. :mod:`cclctl.diagnose.revoked` chooses the record and adds its evidence.
"""

from __future__ import annotations

from cclctl.diagnose import links, text
from cclctl.diagnose.liveness import PROC_RUNNING, PROC_STOPPED
from cclctl.diagnose.model import (
    ABORTED,
    DEAD,
    LINK,
    MISMATCH,
    MISSING,
    NOT_ENTERED,
    STALE,
    STOPPED,
    STUCK,
    Suspect,
    Verdict,
)
from cclctl.diagnose.view import RankState
from cclctl.revocation import OPERATOR, Revocation

#: How the record's line in a verdict's evidence starts.
RECORD = "the job's revoke record: "
_KIND = {"died": DEAD, "link": LINK, "mismatch": MISMATCH, "error": STUCK, "hang": STUCK}
#: What a ``hang`` record's reason says of its origin, by the verdict it was named from
#: (a watchdog writes these, :mod:`cclctl.diagnose_io.hang_origin`); ``{call}``: the call.
HANG_REASONS = {
    STOPPED: "is stopped (process state T)",
    STALE: "stopped publishing its status",
    MISSING: "never published a status",
    NOT_ENTERED: "has not entered {call}",
    STUCK: "is stuck in {call}",
}


def record_verdict(record: Revocation, states: dict[int, RankState]) -> Verdict:
    """The verdict a record says, with the record's lines first in its evidence."""
    seen = f"seen by {record.seer()}"
    evidence = record_lines(record)
    if record.kind in ("aborted", "retry"):
        who = f"operator {record.by or 'unknown'}" if record.origin == OPERATOR else record.seer()
        done = "asked the job to retry" if record.kind == "retry" else "aborted the job"
        step = (
            f"{who} {done} ({record.reason or 'no reason given'}): no rank failed by "
            "itself; ask why, then restart the job"
        )
        verdict = Verdict(ABORTED, record.describe(), [], evidence=evidence, next_step=step)
    elif record.kind == "link":
        peer = record.origin if record.peer is None else record.peer
        a, b = sorted((record.origin, peer))
        suspects = [_suspect(states, record, a), _suspect(states, record, b)]
        summary = f"link {a}<->{b} broke: {record.reason} ({seen})"
        step = links.link_step(suspects)
        verdict = Verdict(LINK, summary, suspects, evidence=evidence, next_step=step, link=(a, b))
    else:
        suspect = _suspect(states, record, record.origin)
        summary, step = _words(record, suspect, states.get(record.origin))
        kind = _hang_kind(record) if record.kind == "hang" else _KIND[record.kind]
        verdict = Verdict(kind, summary, [suspect], evidence=evidence, next_step=step)
    if record.comm and record.seq is not None:
        verdict.place(record.comm, record.seq, record.op)
    return verdict


def _hang_kind(record: Revocation) -> str:
    """The verdict a hang record was named from: its ``symptom``, or in a record written
    before that field existed the words of its reason (stuck when unknown)."""
    if record.symptom:
        return record.symptom if record.symptom in HANG_REASONS else STUCK
    for kind, words in HANG_REASONS.items():
        if record.reason.startswith(words.split("{")[0]):
            return kind
    return STUCK


def _words(record: Revocation, suspect: Suspect, st: RankState | None) -> tuple[str, str]:
    """The summary and next step of a record that blames one rank."""
    rank, seen = record.origin, f"seen by {record.seer()}"
    where = f"on {suspect.host}" if suspect.host else "on its host"
    if record.kind == "died":
        step = (
            f"the job cannot finish without rank {rank}: read the log and exit status of "
            f"{text.who(suspect)} (killed by the OOM killer? `dmesg -T` {where}), then "
            "restart the job or shrink it away"
        )
        return f"rank {rank} is dead: {record.reason} ({seen})", step
    if record.kind == "mismatch":
        step = (
            "the ranks took different code paths: check conditions on rank and data-dependent "
            "shapes around this call"
        )
        step += "; " + text.look([st], "the call site") if st is not None else ""
        return f"rank {rank} {record.reason} ({seen})", step
    if record.kind == "error":
        step = f"read the error and log of {text.who(suspect)}: the others stopped because of it"
        return f"rank {rank} failed: {record.reason} ({seen})", step
    if _hang_kind(record) == STOPPED:
        step = _stopped_step(suspect, st, where)
    elif st is not None:
        step = text.look([st], "where it is")
    else:
        step = f"read the log of {text.who(suspect)}: where it was when the others waited on it"
    return f"rank {rank} {record.reason} ({seen})", step


def _stopped_step(suspect: Suspect, st: RankState | None, where: str) -> str:
    """What to do about a rank a record says was stopped: ``kill -CONT`` only for a process
    seen stopped now on this host; a check for one elsewhere; else who stopped it."""
    proc = None if st is None else st.proc
    why = "then find out who stopped it (a debugger, Ctrl-Z, a supervisor)"
    if proc == PROC_STOPPED and suspect.pid:
        return f"kill -CONT {suspect.pid} {where} lets it run again; {why}"
    if proc is None and st is not None and st.live and suspect.pid:
        return (
            f"{where}: `ps -o stat= -p {suspect.pid}` (T: still stopped, `kill -CONT "
            f"{suspect.pid}` lets it run); {why}"
        )
    now = {PROC_RUNNING: "it runs again now"}.get(proc or "", "its process is gone")
    return f"{now}: find out who stopped {text.who(suspect)} (a debugger, Ctrl-Z, a supervisor)"


def record_lines(record: Revocation) -> list[str]:
    at = record.call or record.at()
    inside = f" in {at}" if at else " outside any call"
    comm = f" of comm {record.comm}" if record.comm else ""
    return [f"{RECORD}{record.describe()}{inside}{comm}"]


def _suspect(states: dict[int, RankState], record: Revocation, rank: int) -> Suspect:
    if rank in states:
        return states[rank].suspect
    if rank == record.origin:
        return Suspect(rank, record.host, record.pid)
    return Suspect(rank)
