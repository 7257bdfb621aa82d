"""The slow-job verdict on ``top``'s table: two columns and a line in words.

Per rank, the entry lag (how long after the median it enters its collectives) and the
wait share (the share of the window it spends inside them): a straggler stands out with
the largest lag and the smallest share, the ranks waiting for it with the largest shares.
Above the rows, what is slow in words (that nothing is, or why it cannot be judged, only
where no hang is found either), and the suspects' rows first when no hang names
anyone, and the two columns kept right after the culprit's own when something is slow
(narrow terminals drop the others first). The figures are the newest judged window's of
:func:`cclctl.diagnose.slow.analyse`.
"""

from __future__ import annotations

import dataclasses

from cclctl.diagnose import slow_report
from cclctl.diagnose.slow_model import SlowReport
from cclctl.live.culprit import OK
from cclctl.live.table import Row, Table

LAG = "entry lag"
WAIT = "wait share"
#: The verdict lines' label.
LABEL = "slow"


def add_slow_columns(model: Table, report: SlowReport | None) -> Table:
    """``model`` with the two columns after ``state`` and the verdict in words."""
    if report is None or report.ranks_seen == 0:  # no rank publishes signals
        return model
    at = model.columns.index("state") + 1 if "state" in model.columns else len(model.columns)
    columns = (*model.columns[:at], LAG, WAIT, *model.columns[at:])
    rows = [_with_cells(row, at, report) for row in model.rows]
    suspects = [r for f in report.findings for r in f.ranks]
    if suspects and all(row.severity == OK for row in rows):
        first = [r for r in rows if r.rank in suspects]
        rows = first + [r for r in rows if r.rank not in suspects]
    verdicts = list(model.verdicts)
    waiting = list(model.waiting)
    if report.findings:
        verdicts += [(LABEL, f.summary) for f in report.findings]
    elif not verdicts:  # beside a hang's verdict, "not slow" or "not judged" says nothing
        waiting.append(f"{LABEL}: {slow_report.verdict(report)}")
    promoted = (*model.promoted, LAG, WAIT) if report.findings else model.promoted
    return dataclasses.replace(
        model, columns=columns, rows=rows, verdicts=verdicts, waiting=waiting, promoted=promoted
    )


def _with_cells(row: Row, at: int, report: SlowReport) -> Row:
    fig = report.figures.get(row.rank)
    lag = slow_report.lag_cell(fig.entry_lag_s) if fig else "-"
    share = slow_report.share_cell(fig.wait_share) if fig else "-"
    return Row(row.rank, (*row.cells[:at], lag, share, *row.cells[at:]), row.severity)
