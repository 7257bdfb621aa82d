"""Third check, per communicator: ranks that made different calls under the same seq.

At one seq every member must call the same op with the same dtype, count and root. Ranks are
grouped by what they called; the largest group is the reference and everyone else is a
suspect. When the largest groups are the same size, the group holding the lowest rank is the
reference (a deterministic rule; the evidence says so). Only the first disagreeing seq gets
a verdict: once ranks diverge, every later seq tends to disagree too, and those are counted.
"""

from __future__ import annotations

from cclctl.diagnose import text
from cclctl.diagnose.model import MISMATCH, Verdict
from cclctl.diagnose.view import CommView, RankState
from cclctl.ranges import fold_ranks
from cclctl.records import CollectiveRecord

Signature = tuple[str, str, int, int | None]


def check_mismatch(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict]
) -> list[Verdict]:
    """At most one ``mismatch`` verdict for this communicator (its first disagreeing seq)."""
    by_seq: dict[int, dict[int, CollectiveRecord]] = {}
    for rank in sorted(cv.position):
        for seq, rec in states[rank].tail.get(cv.comm, {}).items():
            by_seq.setdefault(seq, {})[rank] = rec
    disagreeing = [seq for seq in sorted(by_seq) if len(_groups(by_seq[seq])) > 1]
    if not disagreeing:
        return []
    seq = disagreeing[0]
    groups = _groups(by_seq[seq])
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    reference, ref_ranks = ordered[0]
    others = ordered[1:]
    suspects_ranks = sorted(r for _, ranks in others for r in ranks)
    ref_text = f"{text.ranks_word(ref_ranks)} called {_describe(reference)}"
    lines = [ref_text] + [
        f"{text.ranks_word(ranks)} called {_describe(sig)}" for sig, ranks in others
    ]
    if len(others[0][1]) == len(ref_ranks):
        lines.append(
            f"the largest groups are the same size; the one with rank {ref_ranks[0]} is "
            "taken as the reference"
        )
    if len(disagreeing) > 1:
        later = fold_ranks(disagreeing[1:])  # seq numbers fold like ranks
        lines.append(f"later seqs disagree too ({later}): the ranks have diverged")
    for rank in suspects_ranks:
        if rank in explained:
            for line in lines:
                explained[rank].add(line)
            explained[rank].place(cv.comm, seq, reference[0])
    fresh = [r for r in suspects_ranks if r not in explained]
    if not fresh:
        return []
    suspects = [states[r].suspect for r in fresh]
    if len(others) == 1:
        summary = (
            f"{text.ranks_word(fresh)} called {_describe(others[0][0])} where "
            f"{text.ranks_word(ref_ranks)} called {_describe(reference)} at seq {seq} of "
            f"comm {cv.comm}"
        )
    else:
        summary = (
            f"{text.ranks_word(fresh)} disagree with {text.ranks_word(ref_ranks)} about seq "
            f"{seq} of comm {cv.comm}"
        )
    step = (
        "the ranks took different code paths: check conditions on rank and data-dependent "
        "shapes around this call; " + text.py_spy(suspects, "the call site")
    )
    verdict = Verdict(MISMATCH, summary, suspects, cv.comm, seq, reference[0], lines, step)
    for rank in fresh:
        explained[rank] = verdict
    return [verdict]


def _groups(calls: dict[int, CollectiveRecord]) -> dict[Signature, list[int]]:
    """Ranks by what they called. A field some record leaves empty (a foreign trace without
    dtype or count) is not compared at this seq, so missing data never looks like a mismatch.
    """
    recs = calls.values()
    dtypes = all(r.dtype for r in recs)
    counts = all(r.count for r in recs)
    groups: dict[Signature, list[int]] = {}
    for rank in sorted(calls):
        rec = calls[rank]
        sig = (rec.op, rec.dtype if dtypes else "", rec.count if counts else 0, rec.root)
        groups.setdefault(sig, []).append(rank)
    return groups


def _describe(sig: Signature) -> str:
    """``"all_reduce(float32 x 1024)"``, ``"broadcast(float32 x 1024, root 0)"``."""
    op, dtype, count, root = sig
    parts = [
        f"{dtype} x {count}" if dtype and count else dtype or (f"count {count}" if count else "")
    ]
    if root is not None:
        parts.append(f"root {root}")
    inner = ", ".join(p for p in parts if p)
    return f"{op}({inner})" if inner else op
