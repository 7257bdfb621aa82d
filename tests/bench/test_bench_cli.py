"""`cclctl bench` end to end: real rank processes, real sockets, real exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cclctl.cli import main

ALL_BUT_SENDRECV = "all_reduce,all_gather,reduce_scatter,broadcast,alltoall"


def _run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 90
) -> tuple[int, str, str]:
    """Run ``python -m cclctl ARGS``; on a timeout, Ctrl-C it (the launcher stops its ranks)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    full_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "cclctl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=15)
        finally:
            proc.kill()
            proc.wait()
        raise
    return proc.returncode, out, err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--collective", "all_reduce,bogus"], "--collective"),
        (["-b", "1M", "-e", "1K"], "--minbytes"),
        (["-b", "12Q"], "--minbytes"),
        (["-f", "1"], "--stepfactor"),
        (["-g", "0"], "--nranks"),
        (["-n", "0"], "--iters"),
        (["-a", "4"], "--average"),
        (["-T", "0"], "--timeout"),
        (["--dtype", "complex64"], "--dtype"),
        (["--coll", "broadcast", "--root", "2"], "--root"),
        (["--coll", "all_gather", "-o", "max"], "-o/--op"),
        (["-c", "3"], "--check"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--shared-buffers", "--backend", "gloo"], "--shared-buffers"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cclctl: error: ") and "\n" not in err
    assert flag in err
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sweep_of_five_ops_on_three_ranks_checks_clean(tmp_path: Path) -> None:
    out_json = tmp_path / "out.json"
    code, out, err = _run(
        ["bench", "--collective", ALL_BUT_SENDRECV, "-g", "3", "-c", "1", "--json", str(out_json),
         "-e", "1M"]
    )  # fmt: skip
    assert code == 0, err
    assert err == ""  # rows stream to stdout; stderr stays empty
    assert out.count("# Out of bounds values : 0 OK") == 5
    assert out.count("# Avg bus bandwidth    : ") == 5
    doc = json.loads(out_json.read_text())
    assert doc["ok"] is True and doc["meta"]["world_size"] == 3
    assert doc["meta"]["command"][:3] == ["cclctl", "bench", "--collective"]
    assert doc["complete"] is True
    assert {row["op"] for row in doc["rows"]} == set(ALL_BUT_SENDRECV.split(","))
    for row in doc["rows"]:
        assert row["out_of_place"]["#wrong"] == 0 and row["in_place"]["#wrong"] == 0, row
        assert row["size"] <= 1 << 20
    table_rows = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(table_rows) == len(doc["rows"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_shared_buffers_run_zero_copy_and_check_clean(tmp_path: Path) -> None:
    """--shared-buffers: every op's buffers come from comm.empty() (all_reduce, all_gather,
    reduce_scatter and broadcast run zero-copy from 256 KiB up) and every element checks."""
    out_json = tmp_path / "out.json"
    code, out, err = _run(
        ["bench", "--shared-buffers", "--collective", ALL_BUT_SENDRECV, "-g", "3", "-b", "16K",
         "-e", "256K", "-f", "4", "--json", str(out_json)],
    )  # fmt: skip
    assert code == 0, err
    assert "buffers: shared (zero-copy)" in out
    doc = json.loads(out_json.read_text())
    assert doc["meta"]["shared_buffers"] is True
    for row in doc["rows"]:
        assert row["out_of_place"]["#wrong"] == 0 and row["in_place"]["#wrong"] == 0, row


@pytest.mark.timeout(120)
def test_a_wrong_element_makes_exit_4(tmp_path: Path) -> None:
    out_csv = tmp_path / "out.csv"
    code, out, err = _run(
        ["bench", "--coll", "all_reduce,all_gather", "-e", "4K", "--csv", str(out_csv)],
        env={"CCLCTL_BENCH_CORRUPT": "1:all_gather"},
    )
    assert code == 4, err
    assert "bench check failed: all_gather:" in err and "all_reduce:" not in err
    assert "# Out of bounds values : 0 OK" in out  # all_reduce
    assert "FAILED" in out  # all_gather
    lines = out_csv.read_text().splitlines()
    gathered = [line.split(",") for line in lines[1:] if line.startswith("all_gather")]
    assert gathered and all(cells[9] == "1" and cells[13] == "1" for cells in gathered)


@pytest.mark.timeout(120)
def test_bandwidth_floor_makes_exit_4() -> None:
    code, out, err = _run(["bench", "-e", "1K", "--min-busbw", "1000000", "--json", "-"])
    assert code == 4
    assert "below --min-busbw 1e+06" in err
    doc = json.loads(out)  # --json -: the document instead of the table
    assert doc["ok"] is False and doc["summary"]["all_reduce"]["wrong"] == 0


@pytest.mark.timeout(60)
def test_bad_self_test_spec_is_exit_2() -> None:
    code, _, err = _run(["bench", "-e", "1K"], env={"CCLCTL_BENCH_CORRUPT": "one"})
    assert code == 2 and "CCLCTL_BENCH_CORRUPT" in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_inside_a_launched_job_rank_0_reports(tmp_path: Path) -> None:
    out_csv = tmp_path / "rows.csv"
    code, out, err = _run(
        ["launch", "-n", "2", "--", sys.executable, "-m", "cclctl", "bench", "--collective",
         "broadcast,sendrecv", "--root", "1", "-e", "4K", "--csv", str(out_csv)]
    )  # fmt: skip
    assert code == 0, err
    assert out.count("[rank 0] # Collective test: broadcast") == 1
    assert "[rank 1] #" not in out
    assert "#  Rank  1 Pid" in out
    rows = out_csv.read_text().splitlines()[1:]
    assert {line.split(",")[0] for line in rows} == {"broadcast", "sendrecv"}
    assert all(line.split(",")[5] == "1" for line in rows if line.startswith("broadcast"))
