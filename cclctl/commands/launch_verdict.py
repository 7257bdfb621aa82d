"""The last line of a failed ``cclctl launch``: the failure's origin, not the first exit.

The first rank to exit is rarely the culprit: after a SIGKILL every peer raises, and in a
hang the first rank to time out is one of the waiters. The line names the origin from, in
order: a death by a signal the launcher saw (it is the parent: it knows the signal), the
job's revoke record a rank wrote, the diagnosis of the statuses taken when the job first
failed (processes still as they were) or of the dumps after it ended, and only then the
first rank that exited. Then it says what became of the others and where the dumps are.
An interrupted launch (Ctrl-C, SIGTERM) names the fault the statuses showed as it was
interrupted, if any: an operator who gives up on a hung job learns which rank hung it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from cclctl.config import job_dir
from cclctl.diagnose import engine
from cclctl.diagnose.liveness import PROC_RUNNING, PROC_STOPPED
from cclctl.diagnose.model import DEAD, LINK, MISMATCH, STOPPED, Diagnosis, Verdict
from cclctl.diagnose.text import ranks_word
from cclctl.diagnose_io import procs, sources
from cclctl.diagnose_io.inputs import from_live
from cclctl.errors import CclError
from cclctl.launch.launcher import LaunchResult, RankExit, StoreSeen
from cclctl.live.snapshot import parse
from cclctl.revocation import OPERATOR, Revocation

PREFIX = "cclctl launch: "
#: What a verdict of each kind says of its rank (the call follows).
_KIND_WORDS = {
    DEAD: "died",
    STOPPED: "was stopped (SIGSTOP) at",
    "stale": "stopped publishing its status at",
    "not_entered": "never entered",
    "missing": "left no trace at",
}


class FailureWatch:
    """The ``on_failure`` hook: diagnose the job's statuses the moment it first fails,
    while its processes (a stopped one, a sleeping one) are still there to be seen."""

    def __init__(self) -> None:
        self.live: Diagnosis | None = None

    def __call__(self, first: RankExit | None, seen: StoreSeen | None) -> None:
        if seen is None or not seen.listing:
            return
        job = next(iter(seen.listing)).split("/")[1]  # cclctl/<job>/...
        try:
            inputs = from_live(parse(job, "the launcher's store", seen.listing))
        except CclError:
            return
        if not inputs.snapshots:  # no rank published a status: not a cclctl job, or too soon
            return
        self.live = engine.diagnose(
            inputs.snapshots,
            world_size=inputs.world_size,
            now_ns=inputs.now_ns,
            proc=_still_there(procs.process_states(inputs.snapshots)),
            unreadable=inputs.unreadable,
        )


def _still_there(states: dict[int, str]) -> dict[int, str]:
    """The process states of ranks that still exist: which ranks ended, and how, is the
    launcher's to say (it saw them end); the ranks that failed after the origin are
    already gone when the diagnosis runs and are no culprits."""
    return {r: s for r, s in states.items() if s in (PROC_RUNNING, PROC_STOPPED)}


@dataclasses.dataclass(frozen=True)
class Origin:
    """Who failed first (``subject``: ``rank 6 (pid 3630)``), how, and in which call."""

    subject: str
    how: str
    call: str = ""
    ranks: tuple[int, ...] = ()

    def words(self) -> str:
        call = f" {self.call}" if self.call and self.call not in self.how else ""
        how = self.how
        if not call:  # no call known yet (the statuses predate it): no "at" left hanging
            how = how.removesuffix(" at").removesuffix(" in")
        joiner = "" if not call or how.endswith((" at", " in", " entered")) else " in"
        return " ".join(w for w in (self.subject, how) if w) + joiner + call


def dumps_folder(result: LaunchResult, env: Mapping[str, str] | None = None) -> str:
    """Where the ranks dump: ``CCLCTL_TRACE_DIR``, else the job's default folder."""
    return job_dir(result.job, env)


def verdict_line(
    result: LaunchResult,
    live: Diagnosis | None,
    env: Mapping[str, str] | None = None,
    waiting: str = "",
) -> str:
    """The one line a failed launch ends with (see the module's docstring). An interrupted
    one says what it interrupted: ``waiting``, what the launcher last said of the ranks it
    waited on, else the fault the statuses showed then (a hang an operator gave up on)."""
    if result.interrupted:
        verdict = None if waiting else _best_verdict(live, None)
        if verdict is not None:
            waiting = f"while {_from_verdict(verdict, result).words()}"
        return PREFIX + "interrupted" + (f" {waiting}" if waiting else "") + "; all ranks stopped"
    folder = dumps_folder(result, env)
    dumped = _dump_diagnosis(folder, result.job)
    origin = _origin(result, live, dumped)
    head = "" if not result.timed_out else f"the job did not finish within {result.timeout_s:g}s"
    if origin is None:
        return PREFIX + (head or result.describe()) + "; all ranks stopped" + _dumps(folder)
    parts = [head, origin.words(), _others(result, origin)]
    return PREFIX + "; ".join(p for p in parts if p) + _dumps(folder)


def _origin(
    result: LaunchResult, live: Diagnosis | None, dumped: Diagnosis | None
) -> Origin | None:
    first = result.first_failure
    record = None if result.store is None else result.store.revoke
    if first is not None and first.own_signal:
        return Origin(
            _who(first.rank, first.pid),
            f"died of {first.signal_name}",
            _call_of(first.rank, record, live, dumped),
            (first.rank,),
        )
    if record is not None and record.via != "launcher":
        return _from_record(record, result)
    verdict = _best_verdict(live, dumped)
    if verdict is not None:
        return _from_verdict(verdict, result)
    if first is not None:
        return Origin(
            _who(first.rank, first.pid), f"exited with code {first.returncode}", "", (first.rank,)
        )
    return None


def _from_record(record: Revocation, result: LaunchResult) -> Origin:
    ended = _exit_of(result, record.origin)
    if record.kind == "link":
        return Origin(
            f"the link between rank {record.origin} and rank {record.peer}",
            f"broke ({record.reason})",
            record.at(),
            tuple(r for r in (record.origin, record.peer) if r is not None),
        )
    subject = record.who(host="") if record.pid else _who(record.origin, ended.pid if ended else 0)
    if record.kind == "died":
        how = f"died of {ended.signal_name}" if ended and ended.own_signal else "died"
        return Origin(subject, f"{how} ({record.reason})", record.at(), (record.origin,))
    if record.kind == "retry":  # a rank that cannot retry (shared memory) aborts instead
        who = f"operator {record.by or 'unknown'}"
        asked = f" ({record.reason})" if record.reason else ""
        how = f"was aborted: {who} asked it to retry{asked}, which it cannot do"
        return Origin("the job", how, record.at())
    if record.kind == "aborted":
        return Origin("the job", f"was {record.describe()}", record.at())
    if record.origin == OPERATOR:
        return Origin("the job", record.describe(), record.at())
    how = record.reason if record.kind in (MISMATCH, "hang") else f"failed: {record.reason}"
    return Origin(subject, how, record.at(), (record.origin,))


def _from_verdict(verdict: Verdict, result: LaunchResult) -> Origin:
    call = "" if verdict.op is None else f"{verdict.op} seq {verdict.seq}"
    ranks = tuple(s.rank for s in verdict.suspects)
    if verdict.kind == LINK and verdict.link is not None:
        a, b = verdict.link
        return Origin(f"the link between rank {a} and rank {b}", "broke", call, (a, b))
    if not verdict.suspects:
        return Origin(verdict.summary, "", "", ranks)
    first = verdict.suspects[0]
    pid = first.pid or (_exit_of(result, first.rank) or RankExit(0, 0, None)).pid
    if verdict.kind not in _KIND_WORDS:  # a mismatch, a stuck chain: the summary says it
        named = f"rank {first.rank} "
        summary = verdict.summary
        if len(ranks) == 1 and summary.startswith(named):
            summary = _who(first.rank, pid) + " " + summary[len(named) :]
        return Origin(summary, "", "", ranks)
    subject = _who(first.rank, pid) if len(ranks) == 1 else ranks_word(list(ranks))
    how = _KIND_WORDS[verdict.kind]
    ended = _exit_of(result, first.rank)
    if verdict.kind == DEAD and ended is not None and ended.failed and not ended.stopped:
        how = (
            f"died of {ended.signal_name}"
            if ended.signal_name
            else f"exited with code {ended.returncode}"
        )
    return Origin(subject, how, call, ranks)


def _best_verdict(live: Diagnosis | None, dumped: Diagnosis | None) -> Verdict | None:
    """What the process table proved (dead, stopped) first; then the dumps, which hold
    every rank's last word; then the statuses."""
    live_fault = live.faults[0] if live is not None and live.faults else None
    if live_fault is not None and live_fault.kind in (DEAD, STOPPED):
        return live_fault
    if dumped is not None and dumped.faults:
        return dumped.faults[0]
    return live_fault


def _call_of(
    rank: int, record: Revocation | None, live: Diagnosis | None, dumped: Diagnosis | None
) -> str:
    """The call ``rank``'s death hit: the record's, else a verdict's that names it."""
    if record is not None and record.origin == rank and record.at():
        return record.at()
    for diag in (live, dumped):
        for verdict in [] if diag is None else diag.faults:
            if verdict.op is not None and any(s.rank == rank for s in verdict.suspects):
                return f"{verdict.op} seq {verdict.seq}"
    return ""


_FATES = (  # (singular, plural) of what became of another rank
    ("was revoked", "were revoked"),
    ("failed after it", "failed after it"),
    ("was stopped", "were stopped"),
    ("finished", "finished"),
)


def _others(result: LaunchResult, origin: Origin) -> str:
    """What became of the other ranks: revoked (acknowledged the record), failed after it
    (raised, exit code), stopped by the launcher (its signal), or finished."""
    acks = set() if result.store is None else set(result.store.acks)
    counts = [0, 0, 0, 0]
    for ended in result.exits:
        if ended.rank in origin.ranks:
            continue
        if ended.rank in acks:
            counts[0] += 1
        elif ended.failed and ended.signal_name is None:
            counts[1] += 1  # it raised, before or as it was stopped
        elif ended.failed:
            counts[2] += 1
        else:
            counts[3] += 1
    total = sum(counts)
    named = [(fate, n) for fate, n in zip(_FATES, counts, strict=True) if n]
    # no rank is the origin (an operator's abort): every rank is one of "the others"
    other = "the other " if origin.ranks else ""
    if len(named) == 1:
        if total == 1:
            noun = f"{other or 'the '}rank"
        else:
            noun = f"{other}{total} ranks" if other else f"all {total} ranks"
        return f"{noun} {named[0][0][total != 1]}"
    listed = ", ".join(f"{n} {fate[n != 1]}" for fate, n in named)
    return f"of {other or 'the '}{total} ranks, {listed}" if named else ""


def _dumps(folder: str) -> str:
    return f"; dumps in {folder.rstrip('/')}/" if _has_dumps(folder) else "; no rank left a dump"


def _has_dumps(folder: str) -> bool:
    try:
        return any(n.startswith("cclctl-") and n.endswith(".json") for n in os.listdir(folder))
    except OSError:
        return False


def _dump_diagnosis(folder: str, job: str) -> Diagnosis | None:
    """The post-mortem diagnosis of the job's dumps in ``folder`` (None: none to read)."""
    if not _has_dumps(folder):
        return None
    try:
        inputs = sources.load([folder], job)
        return engine.diagnose(
            inputs.snapshots,
            world_size=inputs.world_size,
            now_ns=inputs.now_ns,
            proc=procs.for_post_mortem(procs.process_states(inputs.snapshots)),
            unreadable=inputs.unreadable,
            notes=inputs.notes,
            remarks=inputs.remarks,
        )
    except CclError:
        return None


def _exit_of(result: LaunchResult, rank: int) -> RankExit | None:
    return next((e for e in result.exits if e.rank == rank), None)


def _who(rank: int, pid: int | None) -> str:
    return f"rank {rank} (pid {pid})" if pid else f"rank {rank}"
