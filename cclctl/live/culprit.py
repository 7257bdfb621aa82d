"""What the live view says about the culprit: the diagnosis, read onto the rows of ``top``.

The verdicts come from :func:`cclctl.diagnose.engine.diagnose` (see
:mod:`cclctl.diagnose_io.live`), never from a second set of rules here: this module only
words each suspect's reason for a table cell, finds the ranks that sit in the call a verdict
blocks (they wait on its suspects, whether or not their records name a peer, as gloo's and
NCCL's do not), and orders the rows: suspects, then other ranks that look wrong, then the
waiting ranks, then the rest.
"""

from __future__ import annotations

import dataclasses
import re

from cclctl.diagnose import text
from cclctl.diagnose.model import Diagnosis, Verdict
from cclctl.live.rank_view import JobView, RankView

SUSPECT = "suspect"
WAITING = "waiting"
WARN = "warn"
OK = "ok"
HIGHLIGHTS = (SUSPECT, WAITING, WARN, OK)

_SUBJECT_VERB = re.compile(r"^(is|are|has|have) ")
_OF_COMM = re.compile(r" of comm \S+")


@dataclasses.dataclass(frozen=True)
class Culprits:
    """The diagnosis as the table uses it.

    ``reasons``: suspect rank -> (verdict kind, reason in words), from the first verdict that
    names it. ``waits_on``: rank -> the suspects it waits on, for ranks inside the call a
    verdict places (comm and seq). ``waiting_lines``: one line per verdict with waiting ranks,
    ``"ranks 0-1,3 wait on rank 2 in all_reduce seq 155"``.
    """

    diagnosis: Diagnosis | None
    reasons: dict[int, tuple[str, str]]
    waits_on: dict[int, tuple[int, ...]]
    waiting_lines: list[str]

    @property
    def faults(self) -> list[Verdict]:
        return self.diagnosis.faults if self.diagnosis is not None else []

    def highlight(self, rank: RankView) -> str:
        """How the row stands out: a suspect, a rank waiting on one, another wrong one, ok."""
        if rank.rank in self.reasons:
            return SUSPECT
        if rank.rank in self.waits_on:
            return WAITING
        return WARN if rank.wrong else OK

    def looks_wrong(self, rank: RankView) -> bool:
        """A suspect of the verdict, or a rank with flags (its own status shows trouble).
        The header, the footer and ``--json``'s ``wrong`` count these, so they never say
        "all look fine" above a verdict (a dead rank's last status may look fine)."""
        return rank.wrong or rank.rank in self.reasons

    def counted(self, ranks: list[RankView]) -> list[str]:
        """``ranks`` as the rows show them, in words: ``["1 suspect", "3 waiting", "1 looks
        wrong"]``, leaving out a kind with none (empty: all look fine)."""
        suspects = waiting = other = 0
        for rank in ranks:
            if rank.rank in self.reasons:
                suspects += 1
            elif rank.rank in self.waits_on:
                waiting += 1
            elif rank.wrong:
                other += 1
        words = []
        if suspects:
            words.append(f"{suspects} suspect{'s' if suspects != 1 else ''}")
        if waiting:
            words.append(f"{waiting} waiting")
        if other:
            words.append(f"{other} {'looks' if other == 1 else 'look'} wrong")
        return words

    def standing(self, ranks: list[RankView], slow: int = 0) -> str:
        """The job in a few words for the header, as the rows below it stand: ``1 suspect
        · 3 waiting · 1 looks wrong`` (the verdicts' suspects, the ranks inside the calls
        they block, other ranks whose own status shows trouble), ``1 finding`` (a
        verdict that blames no rank, as an operator's abort), each followed by ``1 slow``
        where ``diagnose slow`` has ``slow`` findings, or ``all look fine`` (no verdict, no
        rank that looks wrong, nothing slow)."""
        words = self.counted(ranks)
        findings = len(self.faults)
        if not words and findings:
            words.append(f"{findings} finding{'s' if findings != 1 else ''}")
        if slow:
            words.append(f"{slow} slow")
        return " · ".join(words) or "all look fine"


def read_culprits(diagnosis: Diagnosis | None, view: JobView) -> Culprits:
    """Map ``diagnosis`` (None: nothing to diagnose yet) onto the ranks of ``view``."""
    if diagnosis is None:
        return Culprits(None, {}, {}, [])
    reasons: dict[int, tuple[str, str]] = {}
    waits_on: dict[int, tuple[int, ...]] = {}
    lines: list[str] = []
    by_rank = {r.rank: r for r in view.ranks}
    for verdict in diagnosis.faults:
        said = (verdict.kind, reason(verdict))  # once a verdict: it folds every suspect
        for suspect in verdict.suspects:
            reasons.setdefault(suspect.rank, said)
        waiters = _waiters(verdict, by_rank)
        if not waiters:
            continue
        suspects = sorted({s.rank for s in verdict.suspects})
        for rank in waiters:
            waits_on.setdefault(rank, tuple(suspects))
        where = text.call_at(verdict.op, verdict.seq or 0, verdict.comm or "")
        lines.append(
            f"{text.ranks_word(waiters)} {text.verb(waiters, 'waits', 'wait')} on "
            f"{text.ranks_word(suspects)} in {_OF_COMM.sub('', where)}"
        )
    for rank in reasons:
        waits_on.pop(rank, None)  # a suspect is shown as one, even if it also waits
    return Culprits(diagnosis, reasons, waits_on, lines)


def reason(verdict: Verdict) -> str:
    """The verdict's summary without its subject, for a suspect's row: ``"rank 2 never
    entered all_reduce seq 155 of comm 0:0-3"`` -> ``"never entered all_reduce seq 155"``,
    ``"rank 2 is stopped (SIGSTOP)"`` -> ``"stopped (SIGSTOP)"``, ``"... is dead: ..."`` ->
    ``"dead"``. A summary that does not start with its suspects is kept whole.
    """
    words = _OF_COMM.sub("", verdict.summary)
    subject = text.ranks_word(s.rank for s in verdict.suspects) + " "
    if verdict.suspects and words.startswith(subject):
        words = _SUBJECT_VERB.sub("", words[len(subject) :])
    return words.split(": ", 1)[0]


def _waiters(verdict: Verdict, by_rank: dict[int, RankView]) -> list[int]:
    """Ranks inside the collective the verdict places, other than its suspects."""
    if verdict.comm is None or verdict.seq is None or not verdict.suspects:
        return []
    suspects = {s.rank for s in verdict.suspects}
    return sorted(
        rank
        for rank, view in by_rank.items()
        if rank not in suspects
        and (rec := view.inflight) is not None
        and rec.peer is None
        and rec.comm == verdict.comm
        and rec.seq == verdict.seq
    )


def display_order(view: JobView, culprits: Culprits) -> list[RankView]:
    """Suspects in verdict order, then other wrong ranks, the waiting ranks, and the rest."""
    first = {rank: i for i, rank in enumerate(culprits.reasons)}
    rank_of = {SUSPECT: 0, WARN: 1, WAITING: 2, OK: 3}

    def key(rank: RankView) -> tuple[int, int, int]:
        return (rank_of[culprits.highlight(rank)], first.get(rank.rank, 0), rank.rank)

    return sorted(view.ranks, key=key)
