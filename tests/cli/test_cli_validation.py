"""Every command checks its options and CCLCTL_* variables before it starts anything: a bad
one is exit code 2 and one line naming it, and no rank, child or store connection follows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cclctl.config_check import preflight, unknown_variables
from cclctl.errors import ConfigError

PY = sys.executable

#: On PYTHONPATH, this makes every Python process that has a RANK leave a marker file: the
#: proof that a rank of bench or launch started.
RANK_MARKER = """
import os
if "RANK" in os.environ:
    open(os.path.join({folder!r}, "rank" + os.environ["RANK"]), "w").close()
"""


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    folder = tmp_path / "markers"
    folder.mkdir()
    (tmp_path / "sitecustomize.py").write_text(RANK_MARKER.format(folder=str(folder)))
    return folder


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A store address that accepts: a client command that connected leaves a connection."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.setblocking(False)
        yield sock


def cclctl(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    path = os.pathsep.join([str(tmp_path), base.get("PYTHONPATH", "")])
    return subprocess.run(
        [PY, "-m", "cclctl", *args],
        env={**base, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_exit_2(done: subprocess.CompletedProcess[str], names: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"cclctl: error: {names}"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


BENCH = ["bench", "-n", "2", "-e", "8"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        ([*BENCH, "--metrics-port", "70000"], {}, "--metrics-port 70000 is not valid"),
        (BENCH, {"CCLCTL_TIMEOUT": "abc"}, "CCLCTL_TIMEOUT='abc' is not valid: expected a"),
        (BENCH, {"CCLCTL_ALGO": "bogus"}, "CCLCTL_ALGO item 'bogus'"),
        (BENCH, {"CCLCTL_BENCH_CORRUPT": "x"}, "CCLCTL_BENCH_CORRUPT='x' must be"),
        (["launch", "--timeout", "-1", "--", PY, "-c", "pass"], {}, "--timeout -1 is not"),
        (["launch", "--grace", "-2", "--", PY, "-c", "pass"], {}, "--grace -2 is not valid"),
        (["launch", "--port", "70000", "--", PY, "-c", "pass"], {}, "--port 70000 is not"),
        (["launch", "--", PY, "-c", "pass"], {"CCLCTL_METRICS_PORT": "70000"}, "CCLCTL_METRICS_"),
        (["launch", "--", PY, "-c", "pass"], {"CCLCTL_ON_HANG": "panic"}, "CCLCTL_ON_HANG='panic"),
        (BENCH, {"CCLCTL_ON_FAILURE": "grow"}, "CCLCTL_ON_FAILURE='grow' is not valid"),
        (BENCH, {"CCLCTL_RETRY_BUDGET": "soon"}, "CCLCTL_RETRY_BUDGET='soon' is not valid"),
        (["launch", "--", PY, "-c", "pass"], {"CCLCTL_FAULT": "boom"}, "CCLCTL_FAULT item 'boom'"),
        (["launch", "--", PY, "-c", "pass"], {"CCLCTL_STREAMING_COPY": "1"}, "CCLCTL_STREAMING_"),
    ],
)
def test_bench_and_launch_start_no_rank(
    args: list[str], env: dict[str, str], names: str, markers: Path, tmp_path: Path
) -> None:
    done = cclctl(args, env, tmp_path)
    assert_one_line_exit_2(done, names)
    assert list(markers.iterdir()) == []


def test_the_marker_does_show_a_rank_that_ran(markers: Path, tmp_path: Path) -> None:
    """The check above can fail: a launch that starts its rank leaves the marker."""
    done = cclctl(["launch", "--", PY, "-c", "pass"], {}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in markers.iterdir()] == ["rank0"]


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--timeout", "-1"], {}, "--timeout -1 is not valid: must be a positive number"),
        (["--timeout", "0"], {}, "--timeout 0 is not valid"),
        (["--metrics-port", "70000"], {}, "--metrics-port 70000 is not valid"),
        ([], {"CCLCTL_TIMEOUT": "abc"}, "CCLCTL_TIMEOUT='abc' is not valid"),
        ([], {"CCLCTL_METRICS_PORT": "http"}, "CCLCTL_METRICS_PORT='http' is not valid"),
        ([], {"CCLCTL_STORE": "nowhere"}, "CCLCTL_STORE='nowhere' is not valid"),
        ([], {"CCLCTL_TRANSPORT": "pigeon"}, "CCLCTL_TRANSPORT='pigeon' is not valid"),
        ([], {"MASTER_PORT": "99999"}, "MASTER_PORT='99999' is not valid"),
    ],
)
def test_run_never_starts_the_job_misconfigured(
    args: list[str], env: dict[str, str], names: str, tmp_path: Path
) -> None:
    marker = tmp_path / "job-ran"
    done = cclctl(["run", *args, "--", "touch", str(marker)], env, tmp_path)
    assert_one_line_exit_2(done, names)
    assert not marker.exists()


def test_run_starts_the_job_when_all_is_well(tmp_path: Path) -> None:
    marker = tmp_path / "job-ran"
    done = cclctl(["run", "--timeout", "30", "--", "touch", str(marker)], {}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker.exists()


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["top", "--interval", "0"], {}, "--interval must be positive"),
        (["top", "--once"], {"CCLCTL_STORE": "nowhere"}, "CCLCTL_STORE='nowhere' is not valid"),
        (["top", "--once", "--store", "x:0"], {}, "--store 'x:0' is not valid"),
        (["diagnose", "hang", "--stale", "0"], {}, "--stale must be positive"),
        (["diagnose", "hang"], {"CCLCTL_STORE": "h:99999"}, "CCLCTL_STORE='h:99999' is not"),
    ],
)
def test_top_and_diagnose_connect_to_nothing(
    args: list[str],
    env: dict[str, str],
    names: str,
    listener: socket.socket,
    tmp_path: Path,
) -> None:
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    given = {"CCLCTL_STORE": address, **env}  # a good store unless the case spoils it
    done = cclctl(args, given, tmp_path)
    assert_one_line_exit_2(done, names)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing connected


def test_a_typo_in_a_variable_name_is_one_warning_naming_the_right_one(tmp_path: Path) -> None:
    marker = tmp_path / "job-ran"
    done = cclctl(["run", "--", "touch", str(marker)], {"CCLCTL_TIMOUT": "600"}, tmp_path)
    assert done.returncode == 0 and marker.exists()
    assert done.stderr.splitlines() == [
        "cclctl: warning: CCLCTL_TIMOUT is not a cclctl variable and is ignored "
        "(did you mean CCLCTL_TIMEOUT?)"
    ]


def test_unknown_names_and_who_warns() -> None:
    assert unknown_variables({"CCLCTL_TIMEOUT": "1", "CCLCTL_XYZZY_QUUX": "1", "PATH": ""}) == [
        "CCLCTL_XYZZY_QUUX is not a cclctl variable and is ignored"
    ]
    typo = {"CCLCTL_TRACEDIR": "/tmp"}
    assert preflight("launch", env=typo).warnings == (
        "CCLCTL_TRACEDIR is not a cclctl variable and is ignored (did you mean CCLCTL_TRACE_DIR?)",
    )
    rank1 = {**typo, "RANK": "1", "WORLD_SIZE": "2", "CCLCTL_STORE": "h:1"}
    assert preflight("bench", env=rank1).warnings == ()  # only rank 0 of a job says it


def test_launch_ignores_the_store_it_replaces_but_run_checks_it() -> None:
    env = {"CCLCTL_STORE": "left-over"}
    assert preflight("launch", env=env).store is None
    with pytest.raises(ConfigError, match="CCLCTL_STORE='left-over'"):
        preflight("run", env=env)


def test_client_commands_take_the_store_from_the_flag_then_the_environment() -> None:
    env = {"CCLCTL_STORE": "node0:29500"}
    assert preflight("top", {"--store": "node1:1"}, env=env).store == "node1:1"
    assert preflight("top", {"--store": None}, env=env).store == "node0:29500"
    assert preflight("diagnose hang", {"--store": None}, env={}).store is None


def test_bench_as_a_rank_checks_its_place_in_the_job_and_its_store() -> None:
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        preflight("bench", env={"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="CCLCTL_STORE='h' is not valid"):
        preflight("bench", env={"RANK": "0", "WORLD_SIZE": "2", "CCLCTL_STORE": "h"})
    assert preflight("bench", env={"CCLCTL_STORE": "h"}).warnings == ()  # bare: replaced
