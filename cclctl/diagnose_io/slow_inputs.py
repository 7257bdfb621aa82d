"""The slow-job verdict from what ``diagnose hang`` reads: dumps or a live job's statuses.

One function per source, so ``cclctl diagnose slow --store`` and ``cclctl top`` show the
same verdict for the same statuses (:func:`slow_live`), and post-mortem reads the ``signals``
every dump carries (:func:`slow_from_inputs`). Given the paths it read, a rank known only
by a PyTorch Flight Recorder dump counts too, by its entry times
(:mod:`~cclctl.diagnose_io.fr_slow_inputs`); a rank whose document has no signals and no
Flight Recorder dump (an older cclctl) is named in a note and left out of the comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

from cclctl.diagnose import slow_probe
from cclctl.diagnose.slow import analyse
from cclctl.diagnose.slow_model import RankSignals, SlowOptions, SlowReport
from cclctl.diagnose.slow_probe import ProbeEvidence
from cclctl.diagnose.text import ranks_word
from cclctl.diagnose_io.fr_slow_inputs import SOURCE_NOTE, fr_rank_signals
from cclctl.diagnose_io.inputs import Inputs, from_live
from cclctl.live.snapshot import JobStatuses
from cclctl.records import RankSnapshot


def rank_signals(snapshots: list[RankSnapshot]) -> tuple[list[RankSignals], list[int]]:
    """The ranks' windows, and the ranks whose documents carry none."""
    found: list[RankSignals] = []
    without: list[int] = []
    for snap in snapshots:
        if snap.signals is None or not snap.signals.windows:
            without.append(snap.rank)
            continue
        found.append(
            RankSignals(snap.rank, snap.host, snap.signals.window_s, snap.signals.windows, snap.pid)
        )
    return found, without


def slow_from_inputs(
    inputs: Inputs, options: SlowOptions | None = None, paths: Sequence[str] = ()
) -> SlowReport:
    """The verdict over gathered documents (dumps or statuses); ``paths``: where the dumps
    were read from, for the Flight Recorder dumps among them."""
    found, without = rank_signals(inputs.snapshots)
    notes = list(inputs.remarks)
    fr = fr_rank_signals(paths, inputs.snapshots) if paths else None
    if fr is not None and fr.ranks:
        found = sorted([*found, *fr.ranks], key=lambda r: r.rank)
        without = [r for r in without if r not in {s.rank for s in fr.ranks}]
        notes += fr.notes
    if without and found:
        notes.append(f"{ranks_word(without)}: no signals in the document (left out)")
    for rank, why in sorted(inputs.unreadable.items()):
        notes.append(f"rank {rank}: unreadable ({why})")
    job = inputs.snapshots[0].job if inputs.snapshots else ""
    report = analyse(found, job=job, source=inputs.source, options=options, notes=notes)
    if fr is not None and fr.ranks:
        report.reason += f"; {ranks_word(r.rank for r in fr.ranks)} {SOURCE_NOTE}"
    return report


def slow_live(statuses: JobStatuses, options: SlowOptions | None = None) -> SlowReport:
    """The verdict ``top`` and ``diagnose slow --store`` show for a live job."""
    return slow_from_inputs(from_live(statuses), options)


def with_probe(
    report: SlowReport, statuses: JobStatuses
) -> tuple[SlowReport, ProbeEvidence | None]:
    """``report`` with the job's last probe as evidence (:mod:`cclctl.diagnose.slow_probe`),
    judged at the fetch's clock; unchanged and None when the job published no probe."""
    return slow_probe.join(report, statuses.probe, statuses.fetched_ns)
