"""A diagnosis worded for people, as plain strings; the command adds the colours.

Verdicts come first (what, who, why, what to do), then one row per communicator, so the
answer is on the first lines and the context below it.
"""

from __future__ import annotations

import dataclasses

from cclctl.diagnose.model import MAX_EVIDENCE, Diagnosis, Verdict
from cclctl.diagnose.stacks import format_stack
from cclctl.diagnose.text import who

#: Suspects named one by one in a block; the rest are in the folded rank list.
MAX_NAMED = 4
COMM_COLUMNS = ("comm", "members", "size", "state", "last started", "last completed", "in call")


@dataclasses.dataclass(frozen=True)
class Block:
    """One verdict: a kind label, the summary, who (host and pid), evidence and next step."""

    label: str
    summary: str
    suspects: str  # "" when the verdict names nobody
    evidence: list[str]
    next_step: str
    fault: bool
    where: list[str] = dataclasses.field(default_factory=list)  # one stack line per rank
    stacks: list[str] = dataclasses.field(default_factory=list)  # the whole stacks


def headline(diag: Diagnosis) -> str:
    read = f"{diag.ranks_seen}/{diag.world_size} ranks"
    source = "live statuses" if diag.source == "live" else "dumps"
    faults = len(diag.faults)
    found = f"{faults} finding{'s' if faults != 1 else ''}" if faults else "no fault found"
    return f"job {diag.job or '?'} · {source} of {read} · {found}"


def blocks(diag: Diagnosis) -> list[Block]:
    return [_block(v) for v in diag.verdicts]


def _block(verdict: Verdict) -> Block:
    evidence = verdict.evidence[:MAX_EVIDENCE]
    if len(verdict.evidence) > MAX_EVIDENCE:
        evidence.append(f"... and {len(verdict.evidence) - MAX_EVIDENCE} more")
    return Block(
        label=verdict.kind.replace("_", " ").upper(),
        summary=verdict.summary,
        suspects=suspects_line(verdict),
        evidence=evidence,
        next_step=verdict.next_step,
        fault=verdict.fault,
        where=list(verdict.where),
        stacks=stack_lines(verdict),
    )


def stack_lines(verdict: Verdict) -> list[str]:
    """Every thread's stack of the ranks the verdict shows, as ``traceback`` prints them."""
    lines: list[str] = []
    for rank, stacks in verdict.stacks.items():
        lines.append(f"rank {rank}:")
        for stack in stacks:
            lines += ["  " + line for line in format_stack(stack)]
    return lines


def suspects_line(verdict: Verdict) -> str:
    """``"rank 3 (pid 1003 on host-0)"``; many suspects: the first few and the folded list."""
    if not verdict.suspects:
        return ""
    named = ", ".join(who(s) for s in verdict.suspects[:MAX_NAMED])
    if len(verdict.suspects) <= MAX_NAMED:
        return named
    return f"ranks {verdict.ranks}: {named}, ... ({len(verdict.suspects)} in all)"


def comm_rows(diag: Diagnosis) -> list[tuple[str, ...]]:
    """One row per communicator, in :data:`COMM_COLUMNS` order."""
    rows: list[tuple[str, ...]] = []
    for c in diag.comms:
        state = f"hung at seq {c.hung_seq}" if c.hung_seq is not None else c.state
        state = f"shrunk to {c.shrunk_to}" if c.shrunk_to is not None else state
        rows.append(
            (
                c.comm,
                c.to_dict()["members"],
                str(len(c.members)),
                state,
                _span(c.started),
                _span(c.completed),
                str(c.in_flight),
            )
        )
    return rows


def _span(values: tuple[int, int]) -> str:
    low, high = values
    return str(low) if low == high else f"{low}-{high}"


def fault_message(diag: Diagnosis) -> str:
    """The one line the CLI ends a faulty diagnosis with (and exits 3)."""
    faults = diag.faults
    first = faults[0].summary
    more = f" (and {len(faults) - 1} more finding{'s' if len(faults) > 2 else ''})"
    return f"fault found: {first}{more if len(faults) > 1 else ''}"
