"""What ``cclctl launch`` says while ranks that finished wait on ranks still running.

A job's ranks can finish while a peer is stopped or far behind (a broadcast's shared-memory
slots let the others run ahead), and the launcher then waits on that peer. Every status
interval it hands this module the ranks it waits on; the line names each with what the
launcher can know of it: its process state (it is the rank's parent, so a stopped rank shows
state T), the call it is in or the seq it last completed from its status in the job's
store, and the seq the finished ranks reached. A line is printed when what it says changes,
so a rank stopped for an hour is one line, and a lagging rank one line an interval at most.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping

from cclctl.commands.launch_verdict import PREFIX
from cclctl.diagnose.liveness import PROC_GONE, PROC_STOPPED, PROC_ZOMBIE
from cclctl.diagnose.text import call, ranks_word, waiting
from cclctl.diagnose.view import CLOSED
from cclctl.diagnose_io import procs
from cclctl.errors import CclError
from cclctl.launch.launcher import StoreSeen, Waiting
from cclctl.live.snapshot import parse
from cclctl.records import RankSnapshot

#: A process state in words, as the waiting line gives it.
_STATE_WORDS = {
    PROC_STOPPED: "stopped (process state T)",
    PROC_ZOMBIE: "exited, not yet reaped",
    PROC_GONE: "gone",
}


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class WaitWatch:
    """The launcher's ``on_wait`` hook: print the waiting line when it changes.

    ``waiting`` keeps what the last line said of the ranks waited on (``waiting on rank 2
    (pid 881): stopped ...``), for the launcher's last line if it is interrupted meanwhile."""

    def __init__(self, write: Callable[[str], None] = _to_stderr) -> None:
        self.write = write
        self.last = ""
        self.waiting = ""

    def __call__(self, waiting_on: Waiting, seen: StoreSeen | None) -> None:
        states = {
            r: procs.process_state(pid, time.time_ns()) for r, pid in waiting_on.running.items()
        }
        statuses = _statuses(seen)
        line = waiting_line(waiting_on, statuses, states)
        if line != self.last:
            self.last = line
            self.waiting = waiting_phrase(waiting_on, statuses, states)
            self.write(line)


def _statuses(seen: StoreSeen | None) -> dict[int, RankSnapshot]:
    """Every rank's status the store held (none when it did not answer or holds none)."""
    if seen is None or not seen.listing:
        return {}
    job = next(iter(seen.listing)).split("/")[1]  # cclctl/<job>/...
    try:
        return dict(parse(job, "the launcher's store", seen.listing).statuses)
    except CclError:
        return {}


def waiting_line(
    waiting_on: Waiting, statuses: Mapping[int, RankSnapshot], states: Mapping[int, str]
) -> str:
    """``cclctl launch: ranks 0-1,3 finished; waiting on rank 2 (pid 881): stopped (process
    state T), after seq 4 of comm 0:0-3 (the finished ranks completed seq 8)``."""
    phrase = waiting_phrase(waiting_on, statuses, states)
    return f"{PREFIX}{ranks_word(waiting_on.finished)} finished; {phrase}"


def waiting_phrase(
    waiting_on: Waiting, statuses: Mapping[int, RankSnapshot], states: Mapping[int, str]
) -> str:
    """``waiting on rank 2 (pid 881): stopped (process state T), ...``, each rank waited on."""
    finished = [statuses[r] for r in waiting_on.finished if r in statuses]
    each = [
        _rank_phrase(rank, pid, statuses.get(rank), states.get(rank, ""), finished)
        for rank, pid in sorted(waiting_on.running.items())
    ]
    return f"waiting on {'; '.join(each)}"


def _rank_phrase(
    rank: int, pid: int, snap: RankSnapshot | None, state: str, finished: list[RankSnapshot]
) -> str:
    """``rank 2 (pid 881): stopped (process state T), last seen after seq 4 of comm 0:0-3
    (the finished ranks completed seq 8)``: its status may be an interval old."""
    head = f"rank {rank} (pid {pid}): {_STATE_WORDS.get(state, 'running')}"
    if snap is None:
        return f"{head}, no status published yet"
    if snap.finished or snap.reason == CLOSED:
        return f"{head}, its communicator closed"
    rec = snap.inflight
    if rec is not None:
        comm = rec.comm
        blocked = waiting(rec)
        seen = f"in {call(rec)}" + (f" ({blocked})" if blocked else "")
    elif snap.comms:
        comm = max(snap.comms, key=_creation_index)
        done = snap.comms[comm].last_completed
        seen = f"after seq {done} of comm {comm}" if done else f"before comm {comm}'s first call"
    else:
        return f"{head}, no communicator yet"
    done = snap.comms[comm].last_completed if comm in snap.comms else 0
    ahead = max((s.comms[comm].last_completed for s in finished if comm in s.comms), default=0)
    behind = f" (the finished ranks completed seq {ahead})" if ahead > done else ""
    return f"{head}, last seen {seen}{behind}"


def _creation_index(comm: str) -> int:
    """A communicator's creation index (``1`` of ``1:0-5,7``): the latest is the one in use."""
    head = comm.split(":", 1)[0]
    return int(head) if head.isdigit() and len(head) <= 9 else -1
