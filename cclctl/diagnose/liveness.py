"""First check: ranks that cannot take part at all (dead, stopped, silent or never heard of).

The process state (``proc``) comes from the command, which can only look at processes on its
own host; for those the heartbeat is compared with ``stale_after_s`` exactly. Only the
process table says "stopped" (state T) or "dead": a stale status alone is "status stale",
never "stopped", since a rank cut off from the store runs on while its status ages. A rank
on another host is judged on its heartbeat alone, with ``skew_margin_s`` added because that
host's clock may disagree with the reader's, unless its host's agent wrote since: how old
the rank's status was then is read on one clock, that host's. Post-mortem (no ``now_ns``)
there is no heartbeat to judge, so only the process states and the missing documents speak. A rank
whose last status says it closed cleanly is never dead or stale: it finished.
"""

from __future__ import annotations

from collections.abc import Mapping

from cclctl.diagnose import text
from cclctl.diagnose.model import DEAD, MISSING, STALE, STOPPED, Options, Suspect, Verdict
from cclctl.diagnose.view import (
    PROC_GONE,
    PROC_RUNNING,
    PROC_STOPPED,
    PROC_ZOMBIE,
    TERMINATED,
    UNCAUGHT,
    RankState,
)
from cclctl.records import COMPLETED

_NS = 1e9


def check_liveness(
    states: dict[int, RankState],
    world_size: int,
    *,
    source: str,
    now_ns: int | None,
    proc: Mapping[int, str],
    unreadable: Mapping[int, str],
    opts: Options,
    aged: Mapping[int, float] | None = None,
) -> list[Verdict]:
    """Verdicts for missing, dead, SIGSTOPped and silent ranks (one per kind of trouble).
    ``aged``: rank -> how old its status was when its host's agent last wrote, both times
    on that host's clock: a rank elsewhere is stale by it with no skew margin."""
    aged = aged or {}
    on_host: set[int] = set()  # stale by its host's clock, not the reader's
    verdicts: list[Verdict] = []
    missing = [r for r in range(world_size) if r not in states]
    if missing:
        verdicts.append(_missing(missing, source, len(states), unreadable))
    dead: list[RankState] = []
    stopped: list[RankState] = []
    running: dict[int, float] = {}  # stale, but the process runs here
    unknown: dict[int, float] = {}  # stale, and its process cannot be seen from here
    for rank in sorted(states):
        st, ps = states[rank], proc.get(rank)
        if st.closed:
            continue  # it finished and said so: gone and silent is what it should be
        if ps in (PROC_GONE, PROC_ZOMBIE):
            dead.append(st)
        elif ps == PROC_STOPPED:
            stopped.append(st)
        elif now_ns is not None:
            age = (now_ns - st.time_ns) / _NS
            limit = opts.stale_after_s + (0.0 if ps is not None else opts.skew_margin_s)
            if age > limit:
                (running if ps == PROC_RUNNING else unknown)[rank] = age
            elif ps is None and aged.get(rank, 0.0) > opts.stale_after_s:
                unknown[rank] = aged[rank]
                on_host.add(rank)
    if dead:
        verdicts.append(_dead(dead, proc, now_ns))
    if stopped:
        verdicts.append(_sigstopped(stopped))
    if running:
        verdicts.append(_stale_running(states, running, opts))
    if unknown:
        verdicts.append(_unknown(states, unknown, opts, on_host))
    return verdicts


def _missing(ranks: list[int], source: str, seen: int, unreadable: Mapping[int, str]) -> Verdict:
    names = text.ranks_word(ranks)
    silent = [r for r in ranks if r not in unreadable]
    evidence: list[str] = []
    if source == "dumps":
        summary = f"{names} left no dump"
        if silent:
            evidence.append(f"no dump from {text.ranks_word(silent)} among the {seen} read")
        step = (
            "a killed or stopped process writes no dump: check whether "
            f"{names} {text.verb(ranks, 'still runs', 'still run')} (logs, exit status, `ps` "
            "on the host); a running rank dumps on `kill -USR1 <pid>`"
        )
    else:
        summary = f"{names} {text.verb(ranks, 'has', 'have')} no usable status"
        if silent:
            evidence.append(f"no status from {text.ranks_word(silent)} in the store")
        step = (
            f"check that {names} started and can reach the store (the logs); "
            "if a process runs, `py-spy dump --pid <pid>` shows where it is"
        )
    evidence += text.grouped(
        unreadable, lambda r: f"sent a status that cannot be read: {unreadable[r]}"
    )
    suspects = [Suspect(r) for r in ranks]
    return Verdict(MISSING, summary, suspects, evidence=evidence, next_step=step)


def _first_deaths(dead: list[RankState]) -> tuple[list[RankState], list[RankState]]:
    """The dead ranks that died first, and those that ended after them.

    A rank that died without a word (killed: SIGKILL, the OOM killer) came before one that
    said how it ended: an exception (often its call failing as the first one's links
    closed), which came before one that says it was stopped (a launcher stops every rank
    once one is gone, as torchrun does with SIGTERM). Only the first of these kinds that
    has any rank is the origin; with none but stopped ranks, they are."""
    for first in ("", UNCAUGHT, TERMINATED):
        origins = [st for st in dead if _kind(st) == first]
        if origins:
            return origins, [st for st in dead if st not in origins]
    return dead, []


def _kind(st: RankState) -> str:
    return next((word for word in (UNCAUGHT, TERMINATED) if st.ended.startswith(word)), "")


def _dead(dead: list[RankState], proc: Mapping[int, str], now_ns: int | None) -> Verdict:
    dead, after = _first_deaths(dead)
    ranks = [st.rank for st in dead]
    suspects = [st.suspect for st in dead]
    names = text.ranks_word(ranks)
    summary = f"{names} {text.verb(ranks, 'is', 'are')} dead: the process is gone"

    def line(st: RankState) -> str:
        state = "exited, not reaped (zombie)" if proc[st.rank] == PROC_ZOMBIE else "no such process"
        age = f"; last heard of {text.seconds((now_ns - st.time_ns) / _NS)} ago" if now_ns else ""
        return f"{text.who(st.suspect)}: {state}{age}"

    evidence = [line(st) for st in dead]
    how = {st.rank: st.ended for st in after}
    evidence += text.grouped(how, lambda r: f"ended after {names}: {how[r]}")
    first = suspects[0]
    step = (
        f"the job cannot finish without {names}: read the log and exit status of "
        f"{text.who(first)} (killed by the OOM killer? `dmesg -T` on {first.host or 'its host'}),"
        " then restart the job or shrink it away"
    )
    return Verdict(DEAD, summary, suspects, evidence=evidence, next_step=step)


def _sigstopped(stopped: list[RankState]) -> Verdict:
    suspects = [st.suspect for st in stopped]
    ranks = [s.rank for s in suspects]
    summary = f"{text.ranks_word(ranks)} {text.verb(ranks, 'is', 'are')} stopped (SIGSTOP)"
    evidence = [
        f"{text.who(s)}: process state T (stopped by a signal or a debugger)" for s in suspects
    ]
    first = suspects[0]
    more = f" (and the other {len(suspects) - 1})" if len(suspects) > 1 else ""
    step = (
        f"kill -CONT {first.pid} on {first.host or 'its host'}{more} lets it run again; "
        "then find out who stopped it (a debugger, Ctrl-Z, a supervisor)"
    )
    return Verdict(STOPPED, summary, suspects, evidence=evidence, next_step=step)


def _stale_running(states: dict[int, RankState], ages: dict[int, float], opts: Options) -> Verdict:
    suspects = [states[r].suspect for r in sorted(ages)]
    ranks = sorted(ages)
    summary = (
        f"status stale for {text.ranks_word(ranks)}: the process runs (not stopped) but "
        "publishes nothing new"
    )
    evidence = [
        f"{text.who(s)}: running, but its status is {text.seconds(ages[s.rank])} old "
        f"(stale after {text.seconds(opts.stale_after_s)})"
        for s in suspects
    ]
    shows = (
        "whether it is stuck (a held GIL or a blocking call) or only cut off from the store "
        "(its log says `published again` once it is back)"
    )
    step = text.look([states[s.rank] for s in suspects], shows)
    return Verdict(STALE, summary, suspects, evidence=evidence, next_step=step)


def _unknown(
    states: dict[int, RankState], ages: dict[int, float], opts: Options, on_host: set[int]
) -> Verdict:
    suspects = [states[r].suspect for r in sorted(ages)]
    ranks = sorted(ages)
    limit = opts.stale_after_s + opts.skew_margin_s
    summary = f"status stale for {text.ranks_word(ranks)}: no status for too long"

    def line(s: Suspect) -> str:
        age, unseen = text.seconds(ages[s.rank]), "its process cannot be checked from this host"
        if s.rank in on_host:
            stale = text.seconds(opts.stale_after_s)
            return (f"{text.who(s)}: its status was {age} old when its host's agent last "
                    f"wrote (stale after {stale}, on that host's own clock); {unseen}")  # fmt: skip
        return (f"{text.who(s)}: last status {age} ago (stale after {text.seconds(limit)}, "
                f"clock skew margin included); {unseen}")  # fmt: skip

    evidence = [line(s) for s in suspects]
    first = suspects[0]
    step = (
        f"on {first.host or 'its host'}: ps -o stat= -p {first.pid} (T: stopped, "
        f"`kill -CONT {first.pid}`; R/S: running, `py-spy dump --pid {first.pid}` shows "
        "where; nothing: it died, read its log)"
    )
    return Verdict(STALE, summary, suspects, evidence=evidence, next_step=step)


def place_unplaced(verdicts: list[Verdict], states: dict[int, RankState]) -> None:
    """Verdicts that nothing placed take their suggested place (the call their rank had not
    entered when it last reported); a dead, stopped or stale rank no hung call is tied to
    yet (the others' statuses may lag by a beat) is placed by its own last call.
    """
    for verdict in verdicts:
        if verdict.comm is None and verdict.fallback is not None:
            verdict.place(*verdict.fallback)
        if verdict.kind not in (DEAD, STOPPED, STALE) or verdict.comm is not None:
            continue
        st = states.get(verdict.suspects[0].rank)
        calls = [rec for recs in st.tail.values() for rec in recs.values()] if st else []
        if st is None or not calls:
            continue
        last = max(calls, key=lambda r: (r.start_ns, r.comm, r.seq))
        if any(last is rec for rec in st.inflight):
            inside = "stopped inside" if verdict.kind != STALE else "was last seen inside"
            verdict.add(f"rank {st.rank} {inside} {text.call(last)}")
            verdict.place(last.comm, last.seq, last.op)
            continue
        ended = "completed" if last.state == COMPLETED else f"ended {last.state}"
        nxt = st.started(last.comm) + 1
        verdict.add(
            f"rank {st.rank}'s last call, {text.call(last)}, {ended}; it never started "
            f"seq {nxt} of comm {last.comm}"
        )
        verdict.place(last.comm, nxt, None)
