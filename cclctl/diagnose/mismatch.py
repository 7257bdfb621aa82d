"""Third check, per communicator: ranks that made different calls under the same seq.

At one seq every member must call the same op with the same dtype, count and root (an
all_to_allv's count differs by rank and is not compared). Ranks are
grouped by what they called; the largest group is the reference and everyone else is a
suspect. When the largest groups are the same size, the group holding the lowest rank is the
reference (a deterministic rule; the evidence says so), once every member has said what it
called there; while some have not (a live read a moment after the first ranks failed: the
others' statuses still predate the call), a tie decides nothing, and every rank of the tied
groups is a suspect until the others report. Only the first disagreeing seq gets a verdict:
once ranks diverge, every later seq tends to disagree too, and those are counted.
"""

from __future__ import annotations

from cclctl.bandwidth import VARYING
from cclctl.diagnose import call_facts, text
from cclctl.diagnose.model import MISMATCH, Verdict
from cclctl.diagnose.view import CommView, RankState
from cclctl.ranges import fold_ranks

Signature = tuple[str, str, int, int | None]
#: How a verdict's evidence ends while a tie leaves its suspects undecided.
UNDECIDED = "each is a suspect until the others report"


def check_mismatch(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict]
) -> list[Verdict]:
    """At most one ``mismatch`` verdict for this communicator (its first disagreeing seq)."""
    by_seq, inferred = _calls(cv, states)
    disagreeing = [seq for seq in sorted(by_seq) if len(_groups(by_seq[seq])) > 1]
    if not disagreeing:
        return []
    seq = disagreeing[0]
    groups = _groups(by_seq[seq])
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    reference, ref_ranks = ordered[0]
    others = ordered[1:]
    suspects_ranks = sorted(r for _, ranks in others for r in ranks)
    unreported = [m for m in cv.members if m not in by_seq[seq]]
    undecided = len(others[0][1]) == len(ref_ranks) and bool(unreported)
    if undecided:  # a tie among the ranks that reported: each tied group is as odd as the other
        suspects_ranks = sorted({*suspects_ranks, *ref_ranks})
    lines = _grouped(ordered, seq, unreported if undecided else None)
    if seq in inferred:
        lines.append(
            f"{text.ranks_word(inferred[seq])} completed seq {seq}, so they called what the "
            "ranks they exchanged with called"
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
        "shapes around this call; " + text.look([states[r] for r in fresh], "the call site")
    )
    verdict = Verdict(MISMATCH, summary, suspects, cv.comm, seq, reference[0], lines, step)
    for rank in fresh:
        explained[rank] = verdict
    return [verdict]


def _grouped(
    ordered: list[tuple[Signature, list[int]]], seq: int, unreported: list[int] | None
) -> list[str]:
    """What each group called, the reference's first; and, when the largest groups tie,
    how the reference was taken, or (``unreported``: the members whose call is not known
    yet) that none could be."""
    ref_ranks, others = ordered[0][1], ordered[1:]
    lines = [f"{text.ranks_word(ranks)} called {_describe(sig)}" for sig, ranks in ordered]
    if unreported is not None:
        lines.append(
            f"no call of {text.ranks_word(unreported)} at seq {seq} is known yet, and the "
            f"groups of the ranks that called it are the same size: {UNDECIDED}"
        )
    elif len(others[0][1]) == len(ref_ranks):
        lines.append(
            f"the largest groups are the same size; the one with rank {ref_ranks[0]} is "
            "taken as the reference"
        )
    return lines


def _calls(
    cv: CommView, states: dict[int, RankState]
) -> tuple[dict[int, dict[int, Signature]], dict[int, list[int]]]:
    """seq -> rank -> what it called, from the records, from what a failed rank's mismatch
    error says its peer called, and (at such a seq) for ranks that completed it: they agreed
    with their peers, so they called what a completed rank is known to have called. A live
    status keeps only a rank's last calls, so the error is often the only word on the peer.
    Returns the calls and, per seq, the ranks whose call was inferred from completion.
    """
    by_seq: dict[int, dict[int, Signature]] = {}
    claims: dict[int, dict[int, Signature]] = {}
    for rank in sorted(cv.position):
        for seq, rec in states[rank].tail.get(cv.comm, {}).items():
            count = 0 if rec.op in VARYING else rec.count  # differs by rank: not compared
            by_seq.setdefault(seq, {})[rank] = (rec.op, rec.dtype, count, rec.root)
            claim = call_facts.mismatch_claim(rec, seq)
            if claim is not None:
                claims.setdefault(seq, {})[claim[0]] = _parse(claim[1])
    inferred: dict[int, list[int]] = {}
    for seq, said in sorted(claims.items()):
        calls = by_seq.setdefault(seq, {})
        for peer, sig in said.items():
            calls.setdefault(peer, sig)
        done = [r for r, c in cv.completed.items() if c >= seq and not _failed_at(cv, r, seq)]
        known = {calls[r] for r in done if r in calls}
        if len(known) == 1:
            sig = known.pop()
            inferred[seq] = [r for r in done if r not in calls]
            for rank in inferred[seq]:
                calls[rank] = sig
    return by_seq, {seq: ranks for seq, ranks in inferred.items() if ranks}


def _failed_at(cv: CommView, rank: int, seq: int) -> bool:
    rec = cv.open.get(rank)
    return rec is not None and rec.seq == seq


def _parse(text_: str) -> Signature:
    """``"broadcast(float32, root 0, count 1024)"`` (the runtime's words) -> a signature."""
    op, _, inner = text_.partition("(")
    dtype, count, root = "", 0, None
    for part in (p.strip() for p in inner.rstrip(")").split(",")):
        if part.startswith("root ") and part[5:].isdigit():
            root = int(part[5:])
        elif part.startswith("count ") and part[6:].isdigit():
            count = int(part[6:])
        elif part and not dtype:
            dtype = part  # the reduction op, if any, comes after it
    return op, dtype, count, root


def _groups(calls: dict[int, Signature]) -> dict[Signature, list[int]]:
    """Ranks by what they called. A field some call leaves empty (a foreign trace without
    dtype or count) is not compared at this seq, so missing data never looks like a mismatch.
    """
    sigs = calls.values()
    dtypes = all(s[1] for s in sigs)
    counts = all(s[2] for s in sigs)
    groups: dict[Signature, list[int]] = {}
    for rank in sorted(calls):
        op, dtype, count, root = calls[rank]
        sig = (op, dtype if dtypes else "", count if counts else 0, root)
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
