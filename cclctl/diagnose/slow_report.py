"""A slow-job verdict worded for people, as plain strings; commands add the colours.

The verdict line first (what is slow, or that the job is healthy, or why it cannot be
judged yet), then each finding's evidence and what to do, then each rank's entry lag and
wait share, the two figures a straggler stands out in.
"""

from __future__ import annotations

from cclctl.diagnose.slow_model import HEALTHY, SLOW, SlowReport

RANK_COLUMNS = ("rank", "entry lag", "wait share")


def headline(report: SlowReport) -> str:
    """``job j · live statuses of 4 ranks · SLOW: rank 3 is a straggler ...``."""
    source = "live statuses" if report.source == "live" else "dumps"
    seen = f"{report.ranks_seen} rank{'s' if report.ranks_seen != 1 else ''}"
    return f"job {report.job or '?'} · {source} of {seen} · {verdict(report)}"


def verdict(report: SlowReport) -> str:
    """The verdict alone, as ``top`` shows it over its table."""
    if report.status == SLOW:
        first = report.findings[0].summary
        more = len(report.findings) - 1
        return f"SLOW: {first}" + (f" (and {more} more)" if more else "")
    if report.status == HEALTHY:
        return f"not slow: {report.reason}"
    return f"not judged: {report.reason}"


def fault_message(report: SlowReport) -> str:
    """The one line the CLI ends a finding with (exit 3)."""
    return f"slow: {report.findings[0].summary}" + (
        f" (and {len(report.findings) - 1} more)" if len(report.findings) > 1 else ""
    )


def lag_cell(lag_s: float | None) -> str:
    """``+41ms``, ``-0.3ms``, or ``-`` without shared entries."""
    if lag_s is None:
        return "-"
    ms = lag_s * 1e3
    return f"{ms:+.0f}ms" if abs(ms) >= 10 else f"{ms:+.1f}ms"


def share_cell(share: float) -> str:
    return f"{share * 100:.0f}%"


def rank_rows(report: SlowReport) -> list[tuple[str, str, str]]:
    """One row per rank of the newest judged window: rank, entry lag, wait share."""
    return [
        (str(rank), lag_cell(fig.entry_lag_s), share_cell(fig.wait_share))
        for rank, fig in sorted(report.figures.items())
    ]
