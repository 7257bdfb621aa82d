"""`cclctl bench` streams: each row reaches the pipe and the files while the sweep runs, and
Ctrl-C keeps exactly the rows measured so far (table, CSV, JSON) and exits 130."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from cclctl.benchmark import report
from cclctl.benchmark.results import Row

pytestmark = pytest.mark.slow  # a real cclctl bench, interrupted mid-sweep
LONG_SWEEP = ["-e", "1G"]  # far longer than any test waits: interrupted, never finished


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}


@contextlib.contextmanager
def _bench(
    args: list[str], stdout: int | IO[bytes] = subprocess.PIPE
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m cclctl bench ARGS``; whatever the test does, Ctrl-C'd and reaped at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cclctl", "bench", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the launcher stops its ranks
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _until_first_row(stream: IO[bytes]) -> list[str]:
    """Lines read from ``stream`` up to and including the first table row."""
    lines: list[str] = []
    while True:
        line = stream.readline().decode()
        assert line, f"the stream ended before a row: {lines}"
        lines.append(line.rstrip("\n"))
        if line.strip() and not line.startswith("#"):
            return lines


def _table_rows(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not line.startswith("#")]


def _file_rows(csv_path: Path, json_path: Path) -> tuple[list[dict[str, str]], dict]:
    with csv_path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == list(report.CSV_COLUMNS)
        csv_rows = list(reader)
    return csv_rows, json.loads(json_path.read_text())


def _assert_files_hold(table: list[str], csv_rows: list[dict[str, str]], doc: dict) -> None:
    """The CSV and the JSON document hold exactly the table's rows, in its order."""
    assert [report.format_row(Row.from_dict(row)) for row in doc["rows"]] == table
    assert [int(row["size"]) for row in csv_rows] == [int(line.split()[0]) for line in table]
    assert [float(r["out_of_place_time"]) for r in csv_rows] == [
        row["out_of_place"]["time"] for row in doc["rows"]
    ]
    assert doc["complete"] is False and doc["ok"] is False
    assert doc["meta"]["world_size"] == 2 and len(doc["meta"]["ranks"]) == 2


@pytest.mark.timeout(120)
def test_ctrl_c_mid_sweep_keeps_the_streamed_rows_in_the_pipe_and_the_files(
    tmp_path: Path,
) -> None:
    csv_path, json_path = tmp_path / "rows.csv", tmp_path / "rows.json"
    with _bench([*LONG_SWEEP, "--csv", str(csv_path), "-J", str(json_path)]) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        head = _until_first_row(proc.stdout)
        assert proc.poll() is None  # the row came through the pipe while the sweep runs
        csv_rows, doc = _file_rows(csv_path, json_path)  # a row shown is already in the files
        assert len(csv_rows) >= 1 and len(doc["rows"]) >= 1
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read().decode().splitlines()
        err = proc.stderr.read().decode()
        assert proc.wait(60) == 130, err
    lines = head + rest
    table = _table_rows(lines)
    assert table and "# Avg bus bandwidth    : " in lines[-2]  # the open block is closed
    _assert_files_hold(table, *_file_rows(csv_path, json_path))
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reader_dies", [False, True], ids=["cat-lives", "cat-dies-too"])
def test_ctrl_c_through_a_pipe_to_cat(tmp_path: Path, reader_dies: bool) -> None:
    """``cclctl bench -e 1G | cat`` and Ctrl-C: on a terminal the signal reaches cat too, so
    the rest of the table meets a closed pipe; the files and the exit code stay right."""
    csv_path, json_path = tmp_path / "rows.csv", tmp_path / "rows.json"
    with _bench([*LONG_SWEEP, "--csv", str(csv_path), "-J", str(json_path)]) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        cat = subprocess.Popen(["cat"], stdin=proc.stdout, stdout=subprocess.PIPE)
        proc.stdout.close()  # cat holds the pipe now
        try:
            assert cat.stdout is not None
            head = _until_first_row(cat.stdout)
            assert proc.poll() is None
            proc.send_signal(signal.SIGINT)
            if reader_dies:
                cat.send_signal(signal.SIGINT)
            rest = cat.stdout.read().decode().splitlines()
            err = proc.stderr.read().decode()
            assert proc.wait(60) == 130, err
        finally:
            cat.kill()
            cat.wait()
    csv_rows, doc = _file_rows(csv_path, json_path)
    assert "Traceback" not in err and "Broken pipe" not in err
    if reader_dies:  # what cat printed is in the files; rows measured later are there too
        shown = _table_rows(head)
        assert [report.format_row(Row.from_dict(r)) for r in doc["rows"]][: len(shown)] == shown
        assert len(csv_rows) == len(doc["rows"])
    else:
        _assert_files_hold(_table_rows(head + rest), csv_rows, doc)
