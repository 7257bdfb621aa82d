"""The local launcher with real processes: environment, output, failures, signals, orphans."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

import psutil
import pytest

from cclctl.errors import UsageError
from cclctl.runtime.launcher import LaunchResult, launch

PY = sys.executable

# Each rank: print its pid and a grandchild's pid, then behave as its action says. Failing
# actions first wait (through the launcher's store) until every rank is set up, so a rank
# is never stopped before it could install its handlers.
RANK_PROGRAM = r"""
import os, signal, subprocess, sys, time
from cclctl.runtime.store import StoreClient
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
child = subprocess.Popen(["sleep", "60"])
print(f"pids {os.getpid()} {child.pid}", flush=True)
action = dict(a.split("=") for a in sys.argv[1:]).get(str(rank), "sleep")
if action == "leave":
    sys.exit(0)  # exits at once, leaving its sleeping child behind
if action == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
store = StoreClient.from_address(os.environ["CCLCTL_STORE"], connect_timeout_s=10)
store.add("ready", 1)
if action.startswith("exit") or action == "kill":
    while int(store.get("ready")) < world:
        time.sleep(0.01)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(action[4:]))
time.sleep(60)
"""


class Lines:
    """An output sink that remembers every (rank, stream, line)."""

    def __init__(self) -> None:
        self.items: list[tuple[int, str, str]] = []

    def __call__(self, rank: int, stream: str, line: str) -> None:
        self.items.append((rank, stream, line))

    def pids(self) -> list[int]:
        found = [line.split()[1:] for _, _, line in self.items if line.startswith("pids ")]
        return [int(pid) for pair in found for pid in pair]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(pids: Iterable[int], within_s: float = 3.0) -> None:
    pids = list(pids)
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == [], "processes outlived the launch"


def run(actions: dict[int, str], nprocs: int, **kw: object) -> tuple[LaunchResult, Lines, float]:
    lines = Lines()
    started = time.monotonic()
    args = [f"{rank}={action}" for rank, action in actions.items()]
    result = launch([PY, "-c", RANK_PROGRAM, *args], nprocs, output=lines, **kw)  # type: ignore[arg-type]
    return result, lines, time.monotonic() - started


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
        assert len(env["CCLCTL_TOKEN"]) == 32
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
    result, lines, elapsed = run({1: "exit3"}, 3, grace_s=2)
    assert result.returncode == 3
    assert result.first_failure is not None and result.first_failure.rank == 1
    assert result.describe() == "rank 1 failed with exit code 3 (others stopped)"
    assert [e.signal_name for e in result.exits] == ["SIGTERM", None, "SIGTERM"]
    assert elapsed < 15  # not the 60 s the others would have slept
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_a_rank_that_ignores_sigterm_gets_sigkill_after_the_grace_period() -> None:
    result, lines, elapsed = run({0: "ignore-term", 1: "exit2"}, 2, grace_s=0.5)
    assert result.returncode == 2 and result.first_failure is not None
    assert result.first_failure.rank == 1
    assert result.exits[0].signal_name == "SIGKILL"
    assert 0.5 <= elapsed < 15
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_a_rank_killed_by_a_signal_is_reported_with_exit_code_1() -> None:
    result, lines, _ = run({1: "kill"}, 2, grace_s=1)
    assert result.returncode == 1
    assert result.first_failure is not None
    assert (result.first_failure.rank, result.first_failure.signal_name) == (1, "SIGKILL")
    assert result.describe() == "rank 1 was killed by SIGKILL (others stopped)"
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_children_left_behind_by_successful_ranks_are_killed() -> None:
    result, lines, _ = run({0: "leave", 1: "leave"}, 2)
    assert result.returncode == 0
    assert len(lines.pids()) == 4
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_timeout_stops_every_rank() -> None:
    result, lines, elapsed = run({}, 2, timeout_s=1.0, grace_s=1)
    assert result.timed_out and result.returncode == 1 and result.first_failure is None
    assert result.describe() == "the job did not finish within 1s; all ranks stopped"
    assert elapsed < 10
    assert_all_gone(lines.pids())


@pytest.mark.timeout(30)
def test_an_output_callback_error_stops_the_ranks_and_is_raised() -> None:
    pids: list[int] = []

    def broken(rank: int, stream: str, line: str) -> None:
        if line.startswith("pids "):
            pids.extend(int(p) for p in line.split()[1:])
        if len(pids) == 4:  # both ranks are known: now break
            raise RuntimeError("sink broke")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="sink broke"):
        launch([PY, "-c", RANK_PROGRAM], 2, output=broken, grace_s=1)  # ranks sleep 60 s
    assert time.monotonic() - started < 15  # output that cannot be delivered stops the job
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


# --- the command line -------------------------------------------------------------------


def cclctl(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "cclctl", *args], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.timeout(40)
def test_cli_prefixes_lines_and_exits_with_the_failing_ranks_code() -> None:
    program = (
        "import os, sys, time\n"
        "from cclctl.runtime.store import StoreClient\n"
        "rank = int(os.environ['RANK'])\n"
        "print('hello from', rank, flush=True)\n"
        "print('oops', rank, file=sys.stderr, flush=True)\n"
        "store = StoreClient.from_address(os.environ['CCLCTL_STORE'])\n"
        "store.add('said', 1)\n"
        "while rank == 2 and int(store.get('said')) < 3:\n"
        "    time.sleep(0.01)\n"
        "time.sleep(0 if rank == 2 else 30)\n"
        "sys.exit(3)\n"
    )
    done = cclctl("launch", "-n", "3", "--grace", "1", "--", PY, "-c", program)
    assert done.returncode == 3
    assert sorted(done.stdout.splitlines()) == [f"[rank {r}] hello from {r}" for r in range(3)]
    assert "[rank 2] oops 2" in done.stderr.splitlines()
    assert done.stderr.splitlines()[-1] == "cclctl: rank 2 failed with exit code 3 (others stopped)"


@pytest.mark.timeout(40)
def test_cli_reports_a_rank_killed_by_a_signal_with_exit_code_1() -> None:
    program = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = cclctl("launch", "-n", "1", "--", PY, "-c", program)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "cclctl: rank 0 was killed by SIGKILL"


@pytest.mark.timeout(40)
def test_cli_success_and_a_command_without_the_double_dash() -> None:
    done = cclctl("launch", "-n", "2", PY, "-c", "print('ok')")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank 0] ok", "[rank 1] ok"]
    assert done.stderr == ""


@pytest.mark.timeout(40)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "0", "--", "true"], "the number of ranks must be between 1 and 1024, not 0"),
        (["-n", "2000", "--", "true"], "the number of ranks must be between 1 and 1024, not 2000"),
        (["-n", "2"], "no command to launch: give it after --"),
        (["-n", "1", "--", "/no/such/program"], "cannot run '/no/such/program'"),
    ],
)
def test_cli_bad_usage_exits_2_with_one_line(args: list[str], message: str) -> None:
    done = cclctl("launch", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"cclctl: error: {message}")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.timeout(40)
def test_cli_unusable_port_exits_2_naming_it() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = cclctl("launch", "-n", "1", "--port", str(port), "--", "true")
    assert done.returncode == 2
    assert done.stderr == (
        f"cclctl: error: cannot start the store on 127.0.0.1:{port}: Address already in use "
        "(pick another --port, or 0 for a free one)\n"
    )


def test_cli_help_teaches_with_examples() -> None:
    done = cclctl("launch", "--help")
    assert done.returncode == 0
    for needle in ("cclctl launch -n 4 -- python train.py", "torchrun", "srun", "mpirun"):
        assert needle in done.stdout


CTRL_C_RANK = r"""
import os, signal, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # this one needs the SIGTERM that follows
try:
    print(f"ready {os.getpid()}", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("got SIGINT", flush=True)
    sys.exit(0)
"""


@pytest.mark.timeout(40)
def test_ctrl_c_is_forwarded_to_every_rank_then_they_are_stopped() -> None:
    proc = subprocess.Popen(
        [PY, "-m", "cclctl", "launch", "-n", "2", "--grace", "0.5", "--", PY, "-c", CTRL_C_RANK],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = [proc.stdout.readline(), proc.stdout.readline()]
        rank_pids = [int(line.split()[-1]) for line in ready]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    assert "[rank 0] got SIGINT" in out.splitlines()
    assert "[rank 1] got SIGINT" not in out  # it ignored SIGINT and was stopped by SIGTERM
    assert err.splitlines()[-1] == "cclctl: interrupted; all ranks stopped"
    assert_all_gone(rank_pids)


@pytest.mark.timeout(40)
def test_launcher_terminated_by_sigterm_takes_its_ranks_down() -> None:
    proc = subprocess.Popen(
        [PY, "-m", "cclctl", "launch", "-n", "2", "--", PY, "-c", RANK_PROGRAM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for _ in range(2) for p in proc.stdout.readline().split()[-2:]]
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert len(pids) == 4
    assert_all_gone(pids)
