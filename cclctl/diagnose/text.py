"""Short phrases the checks build evidence from, so every verdict words things the same way.

Evidence about many ranks is grouped (ranks that say the same thing share one line with a
folded rank list), so a job of 4,096 ranks gives a handful of lines, not thousands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from cclctl.diagnose.model import Suspect
from cclctl.diagnose.view import PROC_GONE, PROC_RUNNING, PROC_ZOMBIE, RankState
from cclctl.ranges import fold_ranks
from cclctl.records import CollectiveRecord


def ranks_word(ranks: Iterable[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2,5"``."""
    folded = fold_ranks(ranks)
    return f"rank {folded}" if folded.isdigit() else f"ranks {folded}"


def verb(ranks: Sequence[int], one: str, many: str) -> str:
    """``one`` for a single rank, ``many`` otherwise ("waits" / "wait")."""
    return one if len(set(ranks)) == 1 else many


def seconds(value: float) -> str:
    return f"{value:.1f}s"


def call(rec: CollectiveRecord, with_comm: bool = True) -> str:
    """``"all_reduce seq 12 of comm 0:0-3"``, or ``"send to rank 2 (seq 4) of comm 0:0-3"``."""
    where = f" of comm {rec.comm}" if with_comm else ""
    if rec.peer is not None:
        direction = "from" if rec.op == "recv" else "to"
        return f"{rec.op} {direction} rank {rec.peer} (seq {rec.seq}){where}"
    return f"{rec.op} seq {rec.seq}{where}"


def call_at(op: str | None, seq: int, comm: str) -> str:
    """A call known only by its seq (and maybe op): ``"all_reduce seq 12 of comm 0:0-3"``."""
    return f"{op} seq {seq} of comm {comm}" if op else f"seq {seq} of comm {comm}"


def waiting(rec: CollectiveRecord) -> str:
    """``"waiting to recv from rank 1"`` ("" when the record says nothing)."""
    if rec.waiting_on is None:
        return ""
    what = rec.waiting_for or "exchange"
    direction = "to" if what == "send" else "from"
    return f"waiting to {what} {direction} rank {rec.waiting_on}"


def activity(state: RankState) -> str:
    """What a rank is doing now: its oldest call in flight, or that it is outside any."""
    if not state.inflight:
        return "has nothing in flight: it is outside any collective (computing, in I/O, or stuck)"
    rec = state.inflight[0]
    detail = ", ".join(x for x in (f"for {seconds(state.age_s(rec))}", waiting(rec)) if x)
    return f"is in {call(rec)} ({detail})"


def grouped(ranks: Iterable[int], phrase: Callable[[int], str]) -> list[str]:
    """One line per distinct phrase: ``"ranks 0-2 <phrase>"``, ordered by first rank."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(set(ranks)):
        groups.setdefault(phrase(rank), []).append(rank)
    lines = [(members[0], f"{ranks_word(members)} {text}") for text, members in groups.items()]
    return [line for _, line in sorted(lines)]


def who(suspect: Suspect) -> str:
    """``"rank 3 (pid 1234 on host-b)"``."""
    where = suspect.where()
    return f"rank {suspect.rank} ({where})" if where else f"rank {suspect.rank}"


def look(states: Sequence[RankState], shows: str) -> str:
    """The next step for ranks whose Python stack tells where they are.

    Live, for a process that runs (on this host, or elsewhere with a fresh status): its
    ``py-spy dump``. Post-mortem, or once the process is gone, py-spy has nothing to look at:
    the stack its dump holds, or its log when the dump has none.
    """
    first = states[0]
    others = [st.rank for st in states[1:]]
    more = f"; likewise for {ranks_word(others)}" if others else ""
    if first.live and first.pid and first.proc in (None, PROC_RUNNING):
        where = f" on {first.host}" if first.host else ""
        return f"`py-spy dump --pid {first.pid}`{where} (rank {first.rank}) shows {shows}{more}"
    if any(stack.frames for stack in first.stacks):
        return (
            f"the stack in rank {first.rank}'s dump (the stack line above; `--stacks` prints "
            f"every thread) shows {shows}{more}"
        )
    gone = "its process is gone and " if first.proc in (PROC_GONE, PROC_ZOMBIE) else ""
    return (
        f"{gone}rank {first.rank}'s dump holds no Python stack (written by an older cclctl, or "
        f"a Flight Recorder dump without frames): its log, or a dump on `kill -USR1`, shows "
        f"{shows}{more}"
    )


def compare_all(states: Sequence[RankState]) -> str:
    """The next step when nobody says whom it waits on: every member's stack, side by side."""
    if states and states[0].live:
        return "py-spy dump every rank of the communicator and compare where they wait"
    return "compare where every rank of the communicator waits: `--stacks` prints their stacks"
