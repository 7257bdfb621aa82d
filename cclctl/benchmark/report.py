"""The bench report: nccl-tests' table (so parsers and habits carry over), JSON and CSV.

Column widths and number formats follow nccl-tests' all_*_perf output exactly; the lines
above the column header describe cclctl's run instead of CUDA devices. A staged run
(``--stage always``) adds the relay's columns on the right (:mod:`.stage_columns`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Sequence
from typing import Any

from cclctl.benchmark import stage_columns
from cclctl.benchmark.options import AVERAGE_MODES
from cclctl.benchmark.results import BENCH_SCHEMA, BENCH_SCHEMA_VERSION, Row, RunMeta, Timing
from cclctl.errors import CheckFailed

_GROUPS = "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
_NAMES = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
_UNITS = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
_TIMING_COLUMNS = ("time", "algbw", "busbw", "#wrong")
CSV_COLUMNS = (
    "op",
    "size",
    "count",
    "type",
    "redop",
    "root",
    *(
        f"{placement}_{name}"
        for placement in ("out_of_place", "in_place")
        for name in _TIMING_COLUMNS
    ),
)


@dataclasses.dataclass(frozen=True)
class OpSummary:
    """Per-op totals: nccl-tests' "Avg bus bandwidth" and "Out of bounds values"."""

    avg_busbw: float
    out_of_bounds: int  # placements (row x out-of-place/in-place) with any wrong element
    wrong: int  # wrong elements in all

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def format_time(time_us: float) -> str:
    """Microseconds with nccl-tests' precision: 2 decimals under 100, 1 under 10000, else 0."""
    if time_us >= 10000.0:
        return f"{time_us:7.0f}"
    if time_us >= 100.0:
        return f"{time_us:7.1f}"
    return f"{time_us:7.2f}"


def _timing(timing: Timing) -> str:
    wrong = "N/A" if timing.wrong is None else str(timing.wrong)
    time = format_time(timing.time_us)
    return f"  {time:>7}  {timing.algbw:6.2f}  {timing.busbw:6.2f}  {wrong:>5}"


def format_row(row: Row, staged: bool = False) -> str:
    """One table line, as all_*_perf prints it (``staged``: then the relay's cells)."""
    head = f"{row.size:12d}  {row.count:12d}  {row.type:>8}  {row.redop:>6}  {row.root:6d}"
    line = head + _timing(row.out_of_place) + _timing(row.in_place)
    return line + stage_columns.row_cells(row) if staged else line


def column_header(staged: bool = False) -> list[str]:
    """The three header lines above the rows (trailing blanks trimmed)."""
    names = ("size", "count", "type", "redop", "root", *(("time", "algbw", "busbw", "#wrong") * 2))
    units = ("(B)", "(elements)", "", "", "", *(("(us)", "(GB/s)", "(GB/s)", "") * 2))
    lines = [_GROUPS % ("", "", "", "", ""), _NAMES % names, _UNITS % units]
    if staged:  # the relay's groups start where the names' line ends
        width = len(lines[1])
        cells = stage_columns.header_cells()
        lines = [line.ljust(width) + extra for line, extra in zip(lines, cells, strict=True)]
    return [lines[0].rstrip(), lines[1], lines[2].rstrip()]


def summarize(rows: Sequence[Row]) -> OpSummary:
    """Totals over ``rows`` (one op's), averaging busbw over both placements like nccl-tests."""
    timings = [timing for row in rows for timing in row.timings]
    busbw = [timing.busbw for timing in timings]
    wrong = [timing.wrong or 0 for timing in timings]
    return OpSummary(
        avg_busbw=sum(busbw) / len(busbw) if busbw else 0.0,
        out_of_bounds=sum(1 for count in wrong if count),
        wrong=sum(wrong),
    )


def by_op(meta: RunMeta, rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Rows grouped by op, in the order the run asked for the ops."""
    groups: dict[str, list[Row]] = {op: [] for op in meta.options.get("ops", ())}
    for row in rows:
        groups.setdefault(row.op, []).append(row)
    return groups


def run_header(meta: RunMeta) -> list[str]:
    """The lines above the first op's block: the run's settings and its ranks."""
    opts = meta.options
    iters = opts.get("iters")
    warmup = opts.get("warmup_iters")
    average = opts.get("average", 1)
    timeout = opts.get("timeout_s")
    lines = [
        f"# cclctl bench {meta.version}: {', '.join(opts.get('ops', ()))}",
        f"# nRanks {meta.world_size} minBytes {opts.get('minbytes')} "
        f"maxBytes {opts.get('maxbytes')} step: {opts.get('stepfactor')}(factor) "
        f"warmup iters: {'auto' if warmup is None else warmup} "
        f"iters: {'auto' if iters is None else iters} "
        f"validation: {int(bool(opts.get('check')))} "
        f"average: {average}({AVERAGE_MODES.get(average, '?')}) "
        f"timeout: {'default' if timeout is None else f'{timeout:g}s'} backend: {meta.backend}"
        + (" buffers: shared (zero-copy)" if opts.get("shared_buffers") else "")
        + (f" stage: {opts['stage']}" if "stage" in opts else ""),
        "#",
        "# Using ranks",
    ]
    lines += [f"#  Rank {i.rank:2d} Pid {i.pid:6d} on {i.host}" for i in meta.ranks]
    return [*lines, "#"]


def op_header(op: str, staged: bool = False) -> list[str]:
    """The lines that open one op's block of rows."""
    return [f"# Collective test: {op}", *column_header(staged)]


def op_footer(summary: OpSummary, min_busbw: float | None) -> list[str]:
    """The lines that close one op's block: nccl-tests' verdict and average busbw."""
    verdict = "FAILED" if summary.out_of_bounds else "OK"
    floor = ""
    if min_busbw is not None:
        floor = " FAILED" if summary.avg_busbw < min_busbw else " OK"
    return [
        f"# Out of bounds values : {summary.out_of_bounds} {verdict}",
        f"# Avg bus bandwidth    : {summary.avg_busbw:g}{floor}",
        "#",
    ]


def render_table(meta: RunMeta, rows: Sequence[Row]) -> str:
    """The whole report as text: run header, then one block per op."""
    lines = run_header(meta)
    min_busbw = meta.options.get("min_busbw")
    staged = stage_columns.is_staged(meta)
    for op, op_rows in by_op(meta, rows).items():
        lines += op_header(op, staged)
        lines += [format_row(row, staged) for row in op_rows]
        lines += op_footer(summarize(op_rows), min_busbw)
    return "\n".join(lines) + "\n"


def to_document(meta: RunMeta, rows: Sequence[Row], complete: bool = True) -> dict[str, Any]:
    """The versioned JSON document: metadata, every row, per-op summaries and the verdict.

    ``complete`` is False while the sweep runs and after one that stopped early (Ctrl-C, a
    failed rank); such a document holds the rows measured so far and is never ``ok``.
    """
    summaries = {op: summarize(op_rows) for op, op_rows in by_op(meta, rows).items()}
    return {
        "schema": BENCH_SCHEMA,
        "version": BENCH_SCHEMA_VERSION,
        "meta": meta.to_dict(),
        "rows": [row.to_dict() for row in rows],
        "summary": {op: summary.to_dict() for op, summary in summaries.items()},
        "complete": complete,
        "ok": complete and not failures(meta, rows),
    }


def csv_columns(staged: bool = False) -> tuple[str, ...]:
    """The CSV header: CSV_COLUMNS, then the relay's when ``staged``."""
    return (*CSV_COLUMNS, *stage_columns.CSV_COLUMNS) if staged else CSV_COLUMNS


def csv_cells(row: Row, staged: bool = False) -> list[object]:
    """One CSV line's cells, in :func:`csv_columns` order; an unchecked ``#wrong`` is left
    empty."""
    cells: list[object] = [row.op, row.size, row.count, row.type, row.redop, row.root]
    for timing in row.timings:
        wrong = "" if timing.wrong is None else timing.wrong
        cells += [timing.time_us, timing.algbw, timing.busbw, wrong]
    return cells + stage_columns.csv_cells(row) if staged else cells


def render_csv(rows: Sequence[Row], staged: bool = False) -> str:
    """The header line, then one line per row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(csv_columns(staged))
    writer.writerows(csv_cells(row, staged) for row in rows)
    return out.getvalue()


def failures(meta: RunMeta, rows: Sequence[Row]) -> list[str]:
    """Why the run fails its checks (wrong elements, busbw under --min-busbw); [] when fine."""
    reasons = []
    min_busbw = meta.options.get("min_busbw")
    for op, op_rows in by_op(meta, rows).items():
        summary = summarize(op_rows)
        if summary.wrong:
            first = next(r for r in op_rows if any(t.wrong for t in r.timings))
            reasons.append(
                f"{op}: {summary.wrong} wrong elements in {summary.out_of_bounds} results "
                f"(first at size {first.size})"
            )
        if min_busbw is not None and summary.avg_busbw < min_busbw:
            reasons.append(
                f"{op}: average bus bandwidth {summary.avg_busbw:.3g} GB/s is below "
                f"--min-busbw {min_busbw:g}"
            )
    return reasons


def raise_on_failure(meta: RunMeta, rows: Sequence[Row]) -> None:
    """Raise CheckFailed (exit code 4) when :func:`failures` finds anything."""
    reasons = failures(meta, rows)
    if reasons:
        raise CheckFailed("bench check failed: " + "; ".join(reasons), reasons=reasons)
