"""The local launcher with real processes: environment, output, failures, signals, orphans."""

from __future__ import annotations

import json
import threading

import pytest
from launch_helpers import PY, RANK_PROGRAM, Lines, assert_all_gone

from cclctl import auth
from cclctl.errors import UsageError
from cclctl.launch.launcher import LaunchResult, launch


def run(actions: dict[int, str], nprocs: int, **kw: object) -> tuple[LaunchResult, Lines]:
    """The ranks of RANK_PROGRAM, which sleep 60 s unless ``actions`` say otherwise: the
    120 s test timeout is what fails a launcher that waits them out instead of stopping them."""
    lines = Lines()
    args = [f"{rank}={action}" for rank, action in actions.items()]
    result = launch([PY, "-c", RANK_PROGRAM, *args], nprocs, output=lines, **kw)  # type: ignore[arg-type]
    return result, lines


@pytest.mark.timeout(30)
def test_ranks_get_the_job_environment_and_prefixed_output() -> None:
    program = (
        "import json, os, sys\n"
        "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR',"
        " 'MASTER_PORT', 'CCLCTL_STORE', 'CCLCTL_JOB', 'CCLCTL_TOKEN', 'EXTRA']\n"
        "print(json.dumps({k: os.environ.get(k) for k in keys}))\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    lines = Lines()
    result = launch([PY, "-c", program], 3, env={"EXTRA": "yes"}, output=lines)
    assert result.returncode == 0 and result.first_failure is None
    assert [(e.rank, e.returncode) for e in result.exits] == [(0, 0), (1, 0), (2, 0)]
    envs = {rank: json.loads(line) for rank, stream, line in lines.items if stream == "stdout"}
    assert sorted(envs) == [0, 1, 2]
    assert sorted((rank, line) for rank, stream, line in lines.items if stream == "stderr") == [
        (0, "to stderr"),
        (1, "to stderr"),
        (2, "to stderr"),
    ]
    for rank, env in envs.items():
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["CCLCTL_STORE"] == result.store_address
        assert env["MASTER_PORT"] != result.store_address.rpartition(":")[2]
        assert env["CCLCTL_JOB"] == result.job and result.job.startswith("launch-")
        assert len(env["CCLCTL_TOKEN"]) == len(auth.new_token())
        assert env["EXTRA"] == "yes"
    assert len({env["CCLCTL_TOKEN"] for env in envs.values()}) == 1


@pytest.mark.timeout(30)
def test_a_given_job_id_is_kept_and_rank0_stdout_can_be_captured() -> None:
    captured: list[str] = []
    lines = Lines()
    program = "import os; print(os.environ['CCLCTL_JOB'], os.environ['RANK'])"
    result = launch(
        [PY, "-c", program],
        2,
        env={"CCLCTL_JOB": "mine"},
        output=lines,
        capture_rank0_stdout=captured.append,
    )
    assert result.returncode == 0 and result.job == "mine"
    assert captured == ["mine 0"]
    assert lines.items == [(1, "stdout", "mine 1")]


@pytest.mark.timeout(30)
def test_first_failing_rank_stops_the_others_and_is_named() -> None:
    result, lines = run({1: "exit3"}, 3, grace_s=2)
    assert result.returncode == 3
    assert result.first_failure is not None and result.first_failure.rank == 1
    assert result.describe() == "rank 1 failed with exit code 3 (others stopped)"
    assert [e.signal_name for e in result.exits] == ["SIGTERM", None, "SIGTERM"]  # stopped
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_a_rank_that_ignores_sigterm_gets_sigkill_after_the_grace_period() -> None:
    result, lines = run({0: "ignore-term", 1: "exit2"}, 2, grace_s=0.5)
    assert result.returncode == 2 and result.first_failure is not None
    assert result.first_failure.rank == 1
    assert result.exits[0].signal_name == "SIGKILL"  # after the grace, not its 60 s sleep
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_a_rank_killed_by_a_signal_is_reported_with_exit_code_1() -> None:
    result, lines = run({1: "kill"}, 2, grace_s=1)
    assert result.returncode == 1
    assert result.first_failure is not None
    assert (result.first_failure.rank, result.first_failure.signal_name) == (1, "SIGKILL")
    assert result.describe() == "rank 1 was killed by SIGKILL (others stopped)"
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_children_left_behind_by_successful_ranks_are_killed() -> None:
    result, lines = run({0: "leave", 1: "leave"}, 2)
    assert result.returncode == 0
    assert len(lines.pids()) == 4
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_timeout_stops_every_rank() -> None:
    result, lines = run({}, 2, timeout_s=1.0, grace_s=1)
    assert result.timed_out and result.returncode == 1 and result.first_failure is None
    assert result.describe() == "the job did not finish within 1s; all ranks stopped"
    assert [e.signal_name for e in result.exits] == ["SIGTERM", "SIGTERM"]
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_an_output_callback_error_stops_the_ranks_and_is_raised() -> None:
    pids: list[int] = []

    def broken(rank: int, stream: str, line: str) -> None:
        if line.startswith("pids "):
            pids.extend(int(p) for p in line.split()[1:])
        if len(pids) == 4:  # both ranks are known: now break
            raise RuntimeError("sink broke")

    with pytest.raises(RuntimeError, match="sink broke"):  # ranks sleep 60 s: it stops them
        launch([PY, "-c", RANK_PROGRAM], 2, output=broken, grace_s=1)
    assert len(pids) == 4
    assert_all_gone(pids)


@pytest.mark.timeout(30)
def test_launch_works_off_the_main_thread() -> None:
    box: list[LaunchResult] = []
    t = threading.Thread(target=lambda: box.append(launch([PY, "-c", "pass"], 2, output=Lines())))
    t.start()
    t.join(20)
    assert box and box[0].returncode == 0


@pytest.mark.parametrize(
    ("cmd", "nprocs", "kw", "message"),
    [
        ([], 2, {}, "no command to launch: give it after --"),
        (["true"], 0, {}, "the number of ranks must be between 1 and 1024, not 0"),
        (["true"], 1025, {}, "the number of ranks must be between 1 and 1024, not 1025"),
        (["true"], 1, {"port": 70000}, "port 70000 is not a TCP port"),
        (["true"], 1, {"timeout_s": 0}, "the timeout must be a positive number of seconds"),
        (["/no/such/program"], 1, {}, "cannot run '/no/such/program': No such file or directory"),
    ],
)
def test_bad_arguments_are_usage_errors(
    cmd: list[str], nprocs: int, kw: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError) as info:
        launch(cmd, nprocs, **kw)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)
