"""The diagnosis: rank documents in, :class:`~cclctl.diagnose.model.Diagnosis` out.

Pure on purpose: no sockets, files or processes (the commands gather those and pass plain
values), so it is tested with record factories and stays fast at 10,000 ranks. The checks
run in the order of the design, each one leaving the ranks it explained to the next, which
then adds evidence to the existing verdict instead of naming the same rank twice:

1. liveness: missing, dead, SIGSTOPped or stale ranks (a rank that finished is none);
2. the job's revoke records: their origin is the verdict (:mod:`.revoked`);
3. failed calls traced to their cause, so breaks a dead or failed rank explains are its
   evidence and a cut link is named once (:mod:`.followons`);
4. per communicator, the stragglers behind the frontier of a hung collective;
5. per communicator, calls that disagree at the same seq;
6. per hung collective, the chains of ``waiting_on`` and where they end.

With a revoke record every other finding becomes evidence of the origin's verdict.

Everything is iterated in rank, communicator and seq order, so the result never depends on
the order the documents came in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from cclctl import limits
from cclctl.diagnose import text
from cclctl.diagnose.followons import follow_ons
from cclctl.diagnose.frontier import check_frontier
from cclctl.diagnose.left_behind import check_left_behind
from cclctl.diagnose.liveness import check_liveness, place_unplaced
from cclctl.diagnose.mismatch import check_mismatch
from cclctl.diagnose.model import HEALTHY, MAX_STACKS, CommSummary, Diagnosis, Options, Verdict
from cclctl.diagnose.retried import attempts_line, healthy_lines, retried_seqs
from cclctl.diagnose.revoked import origin_verdict, read_records, settle
from cclctl.diagnose.shrunk import note_shrinks, successors
from cclctl.diagnose.stacks import stack_line
from cclctl.diagnose.view import PROC_STATES, CommView, RankState, comm_views, rank_state
from cclctl.diagnose.waits import check_waits
from cclctl.errors import BadInput, UsageError
from cclctl.records import RankSnapshot


def diagnose(
    snapshots: Iterable[RankSnapshot],
    *,
    world_size: int | None = None,
    now_ns: int | None = None,
    proc: Mapping[int, str] | None = None,
    unreadable: Mapping[int, str] | None = None,
    notes: Mapping[int, str] | None = None,
    remarks: Sequence[str] = (),
    options: Options | None = None,
    aged: Mapping[int, float] | None = None,
) -> Diagnosis:
    """Find why a job hangs (or say that it does not).

    ``snapshots``: dumps (post-mortem) or live statuses, any order, at most one job.
    ``now_ns``: the reader's wall clock when it fetched live statuses (None post-mortem);
    heartbeats are judged against it. ``proc``: rank -> local process state ("running",
    "stopped", "zombie", "gone") for the ranks the caller could look at, or their host
    agents did. ``aged``: rank -> how old its status was when its host's agent last wrote,
    on that host's clock (live, ranks elsewhere). ``unreadable``: rank -> why its document
    could not be used (counted as missing). ``notes``: rank -> a
    remark on how its document was chosen, added to the evidence of verdicts naming it.
    ``remarks``: notes on the input as a whole (which kinds of dump were read).

    Raises BadInput when there is nothing to diagnose or the documents mix jobs.
    """
    opts = options or Options()
    source = "live" if now_ns is not None else "dumps"
    unreadable = dict(unreadable or {})
    proc = dict(proc or {})
    for rank, state in proc.items():
        if state not in PROC_STATES:
            raise UsageError(f"process state of rank {rank} is {state!r}, not one of {PROC_STATES}")
    newest, rank_notes = _newest(snapshots)
    if not newest and not unreadable:
        raise BadInput("nothing to diagnose: no rank's dump or status was given")
    job = _job(newest.values())
    size, general = _world_size(newest, unreadable, world_size)
    rank_notes.update(notes or {})
    states = {rank: rank_state(newest[rank]) for rank in sorted(newest)}
    for rank, st in states.items():
        st.live, st.proc = source == "live", proc.get(rank)
    verdicts = check_liveness(states, size, source=source, now_ns=now_ns, proc=proc,
                              unreadable=unreadable, opts=opts, aged=aged)  # fmt: skip
    views, replaced = _check_comms(verdicts, states, opts, rank_notes)
    all_notes = [*remarks, *general] + [f"rank {r}: {rank_notes[r]}" for r in sorted(rank_notes)]
    return Diagnosis(
        job=job,
        source=source,
        world_size=size,
        ranks_seen=len(states),
        verdicts=verdicts,
        comms=[_summary(cv, replaced) for cv in views],
        notes=all_notes,
        options=opts,
    )


def _check_comms(
    verdicts: list[Verdict], states: dict[int, RankState], opts: Options, notes: dict[int, str]
) -> tuple[list[CommView], dict[str, CommView]]:
    """Add the verdicts of the per-communicator checks to liveness's ``verdicts`` (or the
    healthy one when there are none), each with its stacks and notes, in verdict order;
    return the communicators' views and those a shrink replaced (see :func:`successors`).
    With revoke records, the origin's verdict comes first and takes every other finding as
    its evidence (but those of the communicators that replaced the record's)."""
    explained = {s.rank: v for v in verdicts for s in v.suspects}
    revoked = read_records(states)
    origin = origin_verdict(revoked, states, explained) if revoked is not None else None
    if origin is not None:
        verdicts.append(origin)
    views = comm_views(states, opts, doomed=set(explained))
    found = follow_ons(views, states, explained)
    if found.link is not None:
        verdicts.append(found.link)
    for check in (check_frontier, check_mismatch, check_waits):
        for cv in views:
            verdicts += check(cv, states, explained)
    if not any(v.fault for v in verdicts):  # nothing hangs: is a rank left behind?
        for cv in views:
            verdicts += check_left_behind(cv, states, explained, opts.stuck_after_s)
    place_unplaced(verdicts, states)
    found.fold(explained)
    replaced = successors(views, {s.rank for v in verdicts for s in v.suspects})
    if revoked is not None:
        settle(revoked, verdicts, states, replaced)
    retried = retried_seqs(states)
    for verdict in verdicts:
        _show_stacks(verdict, states)
        _join_torch(verdict, states)
        comm, seq = verdict.comm, verdict.seq
        if comm is not None and seq is not None and seq in retried.get(comm, ()):
            verdict.add(attempts_line(states, comm, seq))
        for suspect in verdict.suspects:
            if suspect.rank in notes:
                verdict.add(f"rank {suspect.rank}: {notes[suspect.rank]}")
    note_shrinks(verdicts, replaced, views)  # what a shrink left out goes after what runs now
    if not verdicts:
        verdicts.append(_healthy(views, states))
    verdicts.sort(key=Verdict.sort_key)
    return views, replaced


def _show_stacks(verdict: Verdict, states: dict[int, RankState]) -> None:
    """The one-line stack, and the whole stacks, of the verdict's first ranks that have one."""
    ranks = [s.rank for s in verdict.suspects] or verdict.look_at
    for rank in ranks[:MAX_STACKS]:
        st = states.get(rank)
        line = stack_line(rank, st.stacks) if st is not None else ""
        if st is not None and line:
            verdict.where.append(line)
            verdict.stacks[rank] = st.stacks


def _join_torch(verdict: Verdict, states: dict[int, RankState]) -> None:
    """Name torch's own process group and seq of the verdict's call (what PyTorch's Flight
    Recorder shows), from any rank's record of it; a line says so where cclctl's seq differs
    (cclctl numbers only the calls it traces)."""
    if verdict.comm is None or verdict.seq is None or verdict.op in ("send", "recv"):
        return  # point-to-point calls have seqs of their own, per pair
    comm, seq = verdict.comm, verdict.seq
    for rank in sorted(states):
        st = states[rank]
        open_call = (r for r in st.inflight if r.peer is None and (r.comm, r.seq) == (comm, seq))
        rec = next(open_call, None) or st.tail.get(comm, {}).get(seq)
        if rec is not None and rec.pg_name and rec.torch_seq is not None:
            verdict.pg_name, verdict.torch_seq = rec.pg_name, rec.torch_seq
            if rec.torch_seq != seq:
                verdict.add(
                    f"torch numbers this call seq {rec.torch_seq} of process group "
                    f"{rec.pg_name} (Flight Recorder's collective_seq_id)"
                )
            return


def _newest(snapshots: Iterable[RankSnapshot]) -> tuple[dict[int, RankSnapshot], dict[int, str]]:
    """One document per rank: the newest by its own ``time_ns`` (ties: the one with more
    records, then the higher pid), with a note for every rank that had several.
    """
    best: dict[int, RankSnapshot] = {}
    counts: dict[int, int] = {}
    for snap in snapshots:
        counts[snap.rank] = counts.get(snap.rank, 0) + 1
        old = best.get(snap.rank)
        if old is None or _newer(snap, old):
            best[snap.rank] = snap
    notes = {
        rank: f"{n} documents for this rank; kept the newest (time_ns {best[rank].time_ns})"
        for rank, n in counts.items()
        if n > 1
    }
    return best, notes


def _newer(a: RankSnapshot, b: RankSnapshot) -> bool:
    return (a.time_ns, len(a.records), a.pid, a.host) > (b.time_ns, len(b.records), b.pid, b.host)


def _job(snaps: Iterable[RankSnapshot]) -> str:
    jobs = sorted({s.job for s in snaps})
    if len(jobs) > 1:
        raise BadInput(
            f"the documents come from {len(jobs)} jobs ({', '.join(jobs)}): diagnose one job "
            "at a time",
            jobs=jobs,
        )
    return jobs[0] if jobs else ""


def _world_size(
    newest: dict[int, RankSnapshot], unreadable: Mapping[int, str], given: int | None
) -> tuple[int, list[str]]:
    """The caller's world size, else the largest any document states (at least every rank
    seen, plus one); a note when documents disagree.
    """
    highest = max([*newest, *unreadable], default=-1) + 1
    claimed = sorted({s.world_size for s in newest.values()})
    notes: list[str] = []
    if given is not None:
        limits.world_size(given, "the world size given")
        if given < highest:
            raise UsageError(f"world size {given} is too small: rank {highest - 1} was seen")
        return given, notes
    if len(claimed) > 1:
        listed = ", ".join(map(str, claimed))
        notes.append(f"ranks disagree about the world size ({listed}); using {claimed[-1]}")
    return max([highest, *claimed]), notes


def _healthy(views: list[CommView], states: dict[int, RankState]) -> Verdict:
    evidence: list[str] = []
    for cv in views:
        if cv.inside:
            seq = max(cv.open[r].seq for r in cv.inside if r in cv.open) if cv.open else 0
            longest = max(
                (states[r].age_s(cv.open[r]) for r in cv.inside if r in cv.open), default=0
            )
            evidence.append(
                f"comm {cv.comm}: {text.ranks_word(cv.inside)} in a call (up to seq {seq}, "
                f"the longest for {text.seconds(longest)}): running, not hung"
            )
            continue
        done = sorted(cv.completed.values())
        if done and done[0] == done[-1]:
            evidence.append(f"comm {cv.comm}: every member seen completed seq {done[-1]}")
        elif done:
            evidence.append(
                f"comm {cv.comm}: members completed seqs {done[0]} to {done[-1]}; nothing in flight"
            )
    evidence += healthy_lines(states)
    running = any(cv.inside for cv in views)
    step = (
        "nothing hangs yet; if the job still looks stuck, run this again in a few seconds"
        if running
        else "nothing to do: no rank is missing, stopped, stale, behind or waiting"
    )
    summary = f"no fault found in {len(states)} rank{'s' if len(states) != 1 else ''}"
    return Verdict(HEALTHY, summary, evidence=evidence, next_step=step)


def _summary(cv: CommView, replaced: dict[str, CommView]) -> CommSummary:
    started = list(cv.position.values()) or [0]
    completed = list(cv.completed.values()) or [0]
    return CommSummary(
        comm=cv.comm,
        members=cv.members,
        started=(min(started), max(started)),
        completed=(min(completed), max(completed)),
        in_flight=len(cv.inside),
        hung_seq=cv.hung[-1] if cv.hung and cv.comm not in replaced else None,
        shrunk_to=replaced[cv.comm].comm if cv.comm in replaced else None,
    )
