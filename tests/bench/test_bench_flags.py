"""`cclctl bench` speaks nccl-tests' flags: -n iterations, -o the reduction, -a how ranks'
times combine, -T the timeout, -J the JSON file, and '-' as stdout for every output."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from thread_ranks import run_ranks

from cclctl.benchmark import report
from cclctl.benchmark.sweep import combine_time
from cclctl.cli import main
from cclctl.launch import launcher
from cclctl.runtime.comm.communicator import Communicator


def _run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    full_env.update(env or {})
    out = subprocess.run(
        [sys.executable, "-m", "cclctl", "bench", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=100,
    )
    return out.returncode, out.stdout, out.stderr


@pytest.mark.timeout(120)
def test_n_is_iterations_o_the_reduction_and_json_dash_is_stdout() -> None:
    code, out, err = _run(["-n", "3", "-w", "1", "-o", "max", "-a", "3", "-e", "1K", "-J", "-"])
    assert code == 0, err
    doc = json.loads(out)  # stdout is the document alone; the table went to stderr
    meta = doc["meta"]
    assert meta["world_size"] == 2  # -n 3 is not three ranks
    assert (meta["iters"], meta["warmup_iters"], meta["redop"], meta["average"]) == (3, 1, "max", 3)
    assert doc["rows"] and all(row["redop"] == "max" for row in doc["rows"])
    assert all(row["out_of_place"]["#wrong"] == 0 for row in doc["rows"])  # max, checked
    assert "average: 3(max)" in err and "# Collective test: all_reduce" in err
    table = [line for line in err.splitlines() if line.strip() and not line.startswith("#")]
    assert len(table) == len(doc["rows"]) and doc["complete"] is True


@pytest.mark.timeout(120)
def test_csv_dash_is_stdout_and_the_table_goes_to_stderr() -> None:
    code, out, err = _run(["--coll", "all_gather,broadcast", "-e", "1K", "--csv", "-"])
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == list(report.CSV_COLUMNS)
    assert {row["op"] for row in rows} == {"all_gather", "broadcast"}
    table = [line for line in err.splitlines() if line.strip() and not line.startswith("#")]
    assert [int(line.split()[0]) for line in table] == [int(row["size"]) for row in rows]
    assert not Path("-").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "want"), [(0, 1.0), (1, 2.0), (2, 1.0), (3, 3.0)])
def test_average_modes_combine_the_ranks_times(mode: int, want: float) -> None:
    """-a: 0 rank 0's time, 1 the mean, 2 the minimum, 3 the maximum; every rank agrees."""

    def one_rank(comm: Communicator) -> float:
        return combine_time(comm, float(comm.rank + 1), mode)  # ranks' times 1, 2, 3

    assert run_ranks(3, one_rank, timeout_s=30) == [want] * 3


@pytest.mark.timeout(120)
def test_timeout_bounds_each_collective_and_keeps_the_rows_so_far(tmp_path: Path) -> None:
    """-T 1.5 with rank 1 never entering a collective mid-sweep: rank 0 fails after 1.5 s
    (not the runtime's 60), and the rows measured before stay in the files."""
    csv_path, json_path = tmp_path / "rows.csv", tmp_path / "rows.json"
    code, out, err = _run(
        ["-e", "64K", "-T", "1.5", "--csv", str(csv_path), "-J", str(json_path)],
        env={"CCLCTL_FAULT": "skip:rank=1:seq=300"},
    )
    assert code == 1, err
    timed_out = re.search(r"seq 300 timed out after ([0-9.]+)s", err)
    assert timed_out and "bench did not finish" in err, err
    assert 1.5 <= float(timed_out.group(1)) < 60  # -T, not the runtime's default 60 s
    doc = json.loads(json_path.read_text())
    assert doc["meta"]["timeout_s"] == 1.5 and doc["complete"] is False
    assert 0 < len(doc["rows"]) == len(csv_path.read_text().splitlines()) - 1
    table = [line for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert table == [report.format_row(report.Row.from_dict(row)) for row in doc["rows"]]


@pytest.mark.parametrize("old", ["all_reduce", "allreduce,all_gather", "broadcast"])
def test_the_old_collective_spelling_points_at_collective(
    old: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--op", old])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "-o/--op is the reduction" in err
    assert f"--collective {old}" in err


@pytest.mark.parametrize(
    ("flag", "where", "says"),
    [
        ("-J", "missing/x.json", "no such directory"),
        ("--csv", "missing/x.csv", "no such directory"),
        ("--csv", ".", "is a directory"),
    ],
)
def test_output_paths_are_checked_before_any_rank_starts(
    flag: str,
    where: str,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started: list[object] = []
    monkeypatch.setattr(launcher, "launch", lambda *a, **k: started.append(a))
    path = tmp_path / where
    with pytest.raises(SystemExit) as info:
        main(["bench", flag, str(path)])
    assert info.value.code == 2 and started == []  # no rank was launched
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(path) in err and says in err
    assert not (tmp_path / "missing").exists()


class _Launched(Exception):
    """Raised by the stand-in launcher once it has seen the ranks' environment."""


@pytest.mark.parametrize(("given", "job"), [(None, "bench"), ("nightly", "nightly")])
def test_bare_runs_use_a_stable_job_name(
    given: str | None, job: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, str]] = []

    def fake_launch(*args: object, env: dict[str, str], **kwargs: object) -> None:
        seen.append(env)
        raise _Launched

    monkeypatch.setattr(launcher, "launch", fake_launch)
    monkeypatch.delenv("RANK", raising=False)
    if given is None:
        monkeypatch.delenv("CCLCTL_JOB", raising=False)
    else:
        monkeypatch.setenv("CCLCTL_JOB", given)
    with pytest.raises(_Launched):
        main(["bench", "-e", "1K"])
    assert seen[0]["CCLCTL_JOB"] == job
