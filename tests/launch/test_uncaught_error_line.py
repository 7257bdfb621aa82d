"""A rank's uncaught cclctl error prints as its one line; ``CCLCTL_DEBUG=1`` adds the chain.

Real processes: 4 ranks of tests/support/uncaught_worker.py (no ``try`` around its calls)
under ``python -m cclctl launch``, rank 2 killed before seq 3. Each survivor's error must be
the one line the README shows, with no traceback, unless the debug variable asks for it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import pytest

from cclctl.errors import CommRevoked
from cclctl.telemetry import uncaught
from scripts import script

PY = sys.executable
SURVIVORS = (0, 1, 3)


def launch_with_a_killed_rank(tmp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env.update(
        CCLCTL_FAULT="kill:rank=2:seq=3",
        CCLCTL_TRACE_DIR=str(tmp),
        ITERS="6",
        PAUSE="0.05",
        **extra,
    )
    # a long grace: a survivor on a loaded machine must get to print its error itself
    cmd = [PY, "-m", "cclctl", "launch", "-n", "4", "--grace", "20"]
    cmd += ["--", PY, script("uncaught_worker.py")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def error_line(rank: int) -> str:
    """The README's line for a survivor of rank 2's death at seq 3, after the rank prefix."""
    return (
        rf"rank {rank}: all_reduce\(float32, sum, count 1024\) seq 3 (revoked|failed): "
        rf"rank 2 \(pid \d+ on \S+\) died \(SIGKILL, seen by [^)]*\); dumps in \S+"
    )


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_each_survivor_prints_one_line(tmp_path: Path) -> None:
    done = launch_with_a_killed_rank(tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    for rank in SURVIVORS:
        own = [line for line in output.splitlines() if line.startswith(f"[rank {rank}] ")]
        assert len(own) == 1, own
        assert re.fullmatch(rf"\[rank {rank}\] {error_line(rank)}", own[0]), own[0]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_debug_variable_prints_the_chain(tmp_path: Path) -> None:
    done = launch_with_a_killed_rank(tmp_path, CCLCTL_DEBUG="1")
    assert done.returncode == 1, done.stderr[-3000:]
    output = done.stdout + done.stderr
    for rank in SURVIVORS:
        own = [
            line[len(f"[rank {rank}] ") :]
            for line in output.splitlines()
            if line.startswith(f"[rank {rank}] ")
        ]
        assert own[0] == "Traceback (most recent call last):", own[:3]
        assert "The above exception was the direct cause of the following exception:" in own
        assert re.fullmatch(rf"cclctl\.errors\.\w+: {error_line(rank)}", own[-1]), own[-1]


def test_a_hook_the_program_installed_keeps_every_error() -> None:
    seen: list[BaseException] = []

    def programs_hook(
        etype: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        seen.append(value)

    error = CommRevoked("rank 0: all_reduce seq 3 revoked: rank 2 died")
    uncaught.report(CommRevoked, error, None, programs_hook, brief=True)
    assert seen == [error]


def test_other_errors_reach_the_previous_hook(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[BaseException] = []
    error = ValueError("the program's own bug")
    uncaught.report(ValueError, error, None, lambda t, v, tb: seen.append(v), brief=True)
    assert seen == [error]
    assert capsys.readouterr().err == ""


def test_brief_prints_the_message_alone(capsys: pytest.CaptureFixture[str]) -> None:
    message = "rank 0: all_reduce seq 3 revoked: rank 2 died"
    uncaught.report(CommRevoked, CommRevoked(message), None, sys.__excepthook__, brief=True)
    assert capsys.readouterr().err == message + "\n"
