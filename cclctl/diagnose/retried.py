"""Calls a retry re-ran (``CCLCTL_RETRY_BUDGET``): each rank's attempt at a retried seq.

A retried all_reduce leaves one record per attempt at the same seq, each in its own epoch
(``attempt`` 2 for the first re-run). The views keep each rank's latest attempt; this says,
per retried seq, which attempt each rank reached, so a reader sees that a failed record of
an older epoch was retried and where a rank stayed behind in an attempt the others entered.
"""

from __future__ import annotations

from cclctl.diagnose import text
from cclctl.diagnose.view import RankState, in_flight
from cclctl.records import CollectiveRecord

#: Retried seqs named per communicator in a healthy verdict (the newest ones).
MAX_SEQS = 3


def retried_seqs(states: dict[int, RankState]) -> dict[str, list[int]]:
    """Communicator -> its seqs some rank ran at an attempt above 1, ascending."""
    found: dict[str, set[int]] = {}
    for st in states.values():
        for comm, calls in st.tail.items():
            for seq, rec in calls.items():
                if rec.attempt > 1:
                    found.setdefault(comm, set()).add(seq)
    return {comm: sorted(seqs) for comm, seqs in sorted(found.items())}


def attempts_line(states: dict[int, RankState], comm: str, seq: int) -> str:
    """``"all_reduce seq 11 of comm 0:0-3 was retried: ranks 0-1,3 at attempt 2 (epoch 1,
    completed), rank 2 at attempt 1 (epoch 0, failed)"``."""
    groups: dict[tuple[int, int, str], list[int]] = {}
    op = ""
    for rank in sorted(states):
        rec = states[rank].tail.get(comm, {}).get(seq)
        if rec is None:
            continue
        op = op or rec.op
        groups.setdefault((-rec.attempt, rec.epoch, _state(rec)), []).append(rank)
    parts = [
        f"{text.ranks_word(ranks)} at attempt {-neg} (epoch {epoch}, {state})"
        for (neg, epoch, state), ranks in sorted(groups.items())
    ]
    return f"{op} seq {seq} of comm {comm} was retried: {', '.join(parts)}"


def healthy_lines(states: dict[int, RankState]) -> list[str]:
    """The newest retried seqs of every communicator, one line each."""
    lines = []
    for comm, seqs in retried_seqs(states).items():
        lines += [attempts_line(states, comm, seq) for seq in seqs[-MAX_SEQS:]]
        if len(seqs) > MAX_SEQS:
            lines.append(f"comm {comm}: {len(seqs) - MAX_SEQS} earlier seqs were retried too")
    return lines


def _state(rec: CollectiveRecord) -> str:
    return "in flight" if in_flight(rec) else rec.state.replace("_", " ")
