"""The plan every rank of a retry makes from the same entries (what each brought:
:class:`~.retry_rules.Ask`): which seq the calls open again from, how each seq the ranks
ahead completed catches up the ranks behind, or why it cannot be made exact (refused at
once, naming why). The entries are agreed in the job's store (:mod:`cclctl.runtime.job.
retry`), so every rank makes the same plan.
"""

from __future__ import annotations

from cclctl.errors import CommError
from cclctl.ranges import fold_ranks
from cclctl.runtime.comm.recovery.retry_rules import HELD, REPLAY, RERUNS, SHARED, Ask, Plan
from cclctl.runtime.comm.rerun import HELD_MARK, KEEP_MAX_BYTES, KEEP_MAX_CALLS


def decide(rank: int, entries: dict[int, Ask]) -> Plan:
    """The plan every rank makes from the same entries. All at one seq: re-run it. Calls
    apart (the ranks at the highest seq ``hi`` completed the seqs the others did not):
    each seq from the lowest up to ``hi`` is caught up, the ranks behind taking the
    result of the lowest rank ahead (a broadcast) or, where the result differs by rank,
    the ranks ahead running it again with them from its kept input; then all re-run
    ``hi`` (ranks closing there have nothing to re-run). Anything that cannot be made
    exact is refused at once, naming why."""
    pending = {r: e.pending for r, e in entries.items()}
    lo, hi = min(pending.values()), max(pending.values())
    closing = {r for r, e in entries.items() if e.call == "close" and lo < hi == e.pending}
    odd = sorted(r for r, e in entries.items() if e.call not in RERUNS and r not in closing)
    if odd:
        named = sorted({entries[r].call for r in odd})
        raise CommError(
            f"rank {rank}: cannot retry: rank(s) {fold_ranks(odd)} were in {', '.join(named)}, "
            f"which is not re-run (only {', '.join(RERUNS)})",
            rank=rank,
        )
    roots = tuple(_catch_up(rank, seq, entries) for seq in range(lo, hi))
    _one_call(rank, hi, {e.call for e in entries.values() if e.pending == hi})
    return Plan(lo, roots)


def _one_call(rank: int, seq: int, calls: set[str]) -> None:
    if len(calls) > 1:
        raise CommError(
            f"rank {rank}: cannot retry: the ranks at seq {seq} were in different calls "
            f"({', '.join(sorted(calls))})",
            rank=rank,
        )


def _catch_up(rank: int, seq: int, entries: dict[int, Ask]) -> int:
    """How seq ``seq``, which the ranks ahead of it completed, catches up the others: the
    lowest rank ahead (whose kept result the others take), :data:`REPLAY`, or
    :data:`HELD` where it ended with a confirm (the ranks behind, each inside it with its
    result whole, return that). Every rank ahead must have kept it, as the same call the
    ranks at it are in."""
    ahead = sorted(r for r, e in entries.items() if e.pending > seq)
    lacking = [r for r in ahead if not entries[r].kept_from <= seq <= entries[r].kept]
    if lacking:
        e = entries[lacking[0]]
        held = f"seqs {e.kept_from} to {e.kept}" if e.kept else "none"
        behind = sorted(r for r, x in entries.items() if x.pending <= seq)
        stops = [x.pending for x in entries.values()]
        raise CommError(
            f"rank {rank}: cannot retry: the ranks stopped at seqs {min(stops)} to "
            f"{max(stops)}, and rank(s) {fold_ranks(lacking)} "
            f"no longer keep seq {seq}, which rank(s) {fold_ranks(behind)} lack (rank "
            f"{lacking[0]} keeps {held}; a communicator keeps its completed calls up to "
            f"{KEEP_MAX_BYTES >> 20} MiB or {KEEP_MAX_CALLS} calls)",
            rank=rank,
        )
    labels = {e.kept_ops.split(",")[seq - e.kept_from] for r, e in entries.items() if r in ahead}
    kept = {label.removesuffix(HELD_MARK) for label in labels}
    _one_call(rank, seq, kept | {e.call for e in entries.values() if e.pending == seq})
    (call,) = kept
    if any(label.endswith(HELD_MARK) for label in labels):
        _whole_behind(rank, seq, entries)
        return HELD
    return ahead[0] if call in SHARED else REPLAY


def _whole_behind(rank: int, seq: int, entries: dict[int, Ask]) -> None:
    """A call that ended with a confirm lets no rank complete it before every rank's
    result is whole: every rank behind it must be inside it, holding its result."""
    short = sorted(r for r, e in entries.items() if e.pending <= seq and e.done != seq)
    if short:
        raise CommError(
            f"rank {rank}: cannot retry: seq {seq} ended with a confirm that a rank passed, "
            f"yet rank(s) {fold_ranks(short)} do not hold its result",
            rank=rank,
        )
