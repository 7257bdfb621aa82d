"""Where `cclctl bench` writes while it measures: the table, ``--csv`` and ``-J/--json``.

Every output is opened before any rank starts, so a missing directory or an unwritable file
fails at once (exit 2). Each row then reaches every output as soon as it is measured: table
and CSV lines are flushed per row, and the JSON file is rewritten atomically per row (a
temporary file in the same directory, then ``os.replace``), so a run stopped at any point
leaves valid files that hold exactly the rows printed. ``-`` names stdout for either file;
the table then goes to stderr, so stdout carries only the CSV or the JSON document.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from cclctl.benchmark import report, stage_columns
from cclctl.benchmark.results import Row, RunMeta
from cclctl.errors import ConfigError

STDOUT = "-"


class TextOut:
    """A text stream written line by line and flushed; it stops quietly once its reader is
    gone (``| head``, or Ctrl-C that also ended the ``| cat`` reading it)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.gone = False

    def write(self, lines: Sequence[str]) -> None:
        if self.gone or not lines:
            return
        try:
            self.stream.write("".join(line + "\n" for line in lines))
            self.stream.flush()
        except BrokenPipeError:
            self.gone = True
            _point_at_devnull(self.stream)


def _point_at_devnull(stream: IO[str]) -> None:
    """Send what is still buffered for a closed pipe to /dev/null, so the interpreter's last
    flush at exit cannot fail once more."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


class TableOut:
    """nccl-tests' table, streamed: the run header, then each op's block as its rows come."""

    def __init__(self, out: TextOut) -> None:
        self.out = out
        self._op: str | None = None
        self._op_rows: list[Row] = []
        self._min_busbw: float | None = None
        self._staged = False

    def start(self, meta: RunMeta) -> None:
        self._min_busbw = meta.options.get("min_busbw")
        self._staged = stage_columns.is_staged(meta)
        self.out.write(report.run_header(meta))

    def row(self, row: Row) -> None:
        if row.op != self._op:
            self.finish()
            self._op = row.op
            self.out.write(report.op_header(row.op, self._staged))
        self._op_rows.append(row)
        self.out.write([report.format_row(row, self._staged)])

    def finish(self) -> None:
        """Close the open op's block with its footer (over its rows so far)."""
        if self._op is not None:
            self.out.write(report.op_footer(report.summarize(self._op_rows), self._min_busbw))
        self._op, self._op_rows = None, []


def checked_path(path: str, flag: str) -> Path:
    """``path`` as a file this process can create or overwrite; else ConfigError (exit 2)."""
    target = Path(path)
    parent = target.parent
    name = flag.split("/")[-1]
    if target.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory", flag=name)
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: no such directory {str(parent)!r}", flag=name)
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable", flag=name)
    return target


class CsvOut:
    """``--csv``: the header at once, then one flushed line per row (``staged``: with the
    relay's columns)."""

    def __init__(self, path: str, staged: bool = False) -> None:
        self._staged = staged
        self._file: IO[str]
        if path == STDOUT:
            self._file, self._owned = sys.stdout, False
        else:
            target = checked_path(path, "--csv")
            try:
                self._file, self._owned = target.open("w", encoding="utf-8", newline=""), True
            except OSError as exc:
                raise ConfigError(f"--csv {path}: {exc.strerror}", flag="--csv") from None
        self._out = TextOut(self._file)
        self._lines([report.csv_columns(staged)])

    def _lines(self, rows: Sequence[Sequence[object]]) -> None:
        buf = _LineBuffer()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        self._out.write(buf.lines)

    def row(self, row: Row) -> None:
        self._lines([report.csv_cells(row, self._staged)])

    def close(self) -> None:
        if self._owned:
            self._file.close()


class _LineBuffer:
    """Collects what csv.writer writes, as lines without their newline."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text.rstrip("\n"))


class JsonOut:
    """``-J/--json``: the whole document, rewritten atomically after every row; with ``-``
    printed once to stdout when the run ends (a pipe cannot be rewritten)."""

    def __init__(self, path: str, meta: RunMeta) -> None:
        self._target = None if path == STDOUT else checked_path(path, "-J/--json")
        self._path = path
        if self._target is not None:
            try:
                self.write(meta, [], complete=False)
            except OSError as exc:
                raise ConfigError(f"-J/--json {path}: {exc.strerror}", flag="--json") from None

    def write(self, meta: RunMeta, rows: Sequence[Row], complete: bool) -> None:
        if self._target is None:
            return
        temp = self._target.with_name(f".{self._target.name}.{os.getpid()}.tmp")
        temp.write_text(_document_text(meta, rows, complete), encoding="utf-8")
        os.replace(temp, self._target)

    def close(self, meta: RunMeta, rows: Sequence[Row], complete: bool) -> None:
        if self._target is None:
            TextOut(sys.stdout).write([_document_text(meta, rows, complete).rstrip("\n")])
        else:
            self.write(meta, rows, complete)


def _document_text(meta: RunMeta, rows: Sequence[Row], complete: bool) -> str:
    document: dict[str, Any] = report.to_document(meta, rows, complete)
    return json.dumps(document, indent=2) + "\n"


class Outputs:
    """Every output of one run, opened together before any rank starts; rows fan out to each.

    ``meta`` is the provisional metadata an early JSON file holds until rank 0's arrives.
    """

    def __init__(self, json_path: str | None, csv_path: str | None, meta: RunMeta) -> None:
        if json_path == STDOUT and csv_path == STDOUT:
            raise ConfigError("--csv - and -J/--json - cannot both be stdout", flag="--json")
        if json_path and json_path == csv_path:
            raise ConfigError(f"--csv and -J/--json both name {json_path}", flag="--json")
        for path, flag in ((csv_path, "--csv"), (json_path, "-J/--json")):
            if path and path != STDOUT:
                checked_path(path, flag)  # both checked before either file is made
        to_stdout = STDOUT in (json_path, csv_path)
        self.table = TableOut(TextOut(sys.stderr if to_stdout else sys.stdout))
        self.csv = CsvOut(csv_path, stage_columns.is_staged(meta)) if csv_path else None
        self.json = JsonOut(json_path, meta) if json_path else None
        self.meta = meta
        self.rows: list[Row] = []
        self._started = self._closed = False

    def row(self, meta: RunMeta, row: Row) -> None:
        """One measured row: to the files first, then the table, so a row on screen is
        already in every file."""
        self._start(meta)
        self.rows.append(row)
        if self.csv is not None:
            self.csv.row(row)
        if self.json is not None:
            self.json.write(meta, self.rows, complete=False)
        self.table.row(row)

    def _start(self, meta: RunMeta) -> None:
        self.meta = meta
        if not self._started:
            self._started = True
            self.table.start(meta)

    def close(self, meta: RunMeta | None, complete: bool) -> None:
        """Finish every output: the open op's footer, the files' last state. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if meta is not None and (complete or self._started):
            self._start(meta)
        self.table.finish()
        if self.csv is not None:
            self.csv.close()
        if self.json is not None:
            self.json.close(self.meta, self.rows, complete)
