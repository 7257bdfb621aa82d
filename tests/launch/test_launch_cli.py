"""`cclctl launch` as users run it: a real `python -m cclctl` process, its output and codes."""

from __future__ import annotations

import re
import signal
import socket
import subprocess

import pytest
from launch_helpers import PY, RANK_PROGRAM, assert_all_gone


def cclctl(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "cclctl", *args], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.timeout(40)
def test_cli_prefixes_lines_and_exits_with_the_failing_ranks_code() -> None:
    program = (
        "import os, sys, time\n"
        "from cclctl.store.client import StoreClient\n"
        "rank = int(os.environ['RANK'])\n"
        "print('hello from', rank, flush=True)\n"
        "print('oops', rank, file=sys.stderr, flush=True)\n"
        "store = StoreClient.from_address(os.environ['CCLCTL_STORE'],"
        " token=os.environ['CCLCTL_TOKEN'])\n"
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
    assert re.fullmatch(
        r"cclctl launch: rank 2 \(pid \d+\) exited with code 3; "
        r"the other 2 ranks were stopped; no rank left a dump",
        done.stderr.splitlines()[-1],
    )


@pytest.mark.timeout(40)
def test_cli_reports_a_rank_killed_by_a_signal_with_exit_code_1() -> None:
    program = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = cclctl("launch", "-n", "1", "--", PY, "-c", program)
    assert done.returncode == 1
    assert re.fullmatch(
        r"cclctl launch: rank 0 \(pid \d+\) died of SIGKILL; no rank left a dump",
        done.stderr.splitlines()[-1],
    )


@pytest.mark.timeout(40)
def test_cli_success_and_a_command_without_the_double_dash() -> None:
    done = cclctl("launch", "-n", "2", PY, "-c", "print('ok')")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank 0] ok", "[rank 1] ok"]
    assert [line.split()[:2] for line in done.stderr.splitlines()] == [
        ["cclctl:", "job"],
        ["cclctl", "top"],
        ["cclctl", "diagnose"],
    ]


@pytest.mark.timeout(40)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "0", "--", "true"], "-n 0 is not valid: the number of ranks is 1 to 1024"),
        (["-n", "2000", "--", "true"], "-n 2000 is not valid: the number of ranks is 1 to 1024"),
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
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = cclctl("launch", "-n", "1", "--port", str(port), "--", "true")
    assert done.returncode == 2
    assert done.stderr == (
        f"cclctl: error: cannot start the store on 127.0.0.1:{port}: Address already in use "
        "(no lingering cclctl store of yours was found on it); pick another --port, or 0 "
        "for a free one\n"
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
    assert err.splitlines()[-1] == "cclctl launch: interrupted; all ranks stopped"
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
