"""Run real torch.distributed (gloo) jobs for the tests: N local ranks through cclctl's
launcher, which sets torchrun's variables, stops every rank on failure or timeout and
leaves no process behind.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block

from cclctl.launch.launcher import LaunchResult, launch

HERE = Path(__file__).parent
PY = sys.executable


class Lines:
    """Output sink that keeps every (rank, stream, line)."""

    def __init__(self) -> None:
        self.items: list[tuple[int, str, str]] = []

    def __call__(self, rank: int, stream: str, line: str) -> None:
        self.items.append((rank, stream, line))

    def of(self, rank: int, stream: str = "stdout") -> list[str]:
        return [line for r, s, line in self.items if r == rank and s == stream]

    def text(self) -> str:
        return "\n".join(f"[{r} {s}] {line}" for r, s, line in self.items)


def run_job(
    script: str,
    nprocs: int,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    prefix: Sequence[str] = (),
    port: int = 0,
) -> tuple[LaunchResult, Lines]:
    """Run ``tests/torch/<script>`` as ``nprocs`` ranks; ``prefix`` goes before python
    (``cclctl run --``)."""
    lines = Lines()
    cmd = [*prefix, PY, str(HERE / script), *args]
    result = launch(
        cmd, nprocs, env=dict(env or {}), output=lines, timeout_s=timeout_s, grace_s=2.0, port=port
    )
    return result, lines


def child_env(**extra: str) -> dict[str, str]:
    """Variables for jobs: quiet torch warnings, plus ``extra``."""
    env = {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


def free_port() -> int:
    """A free port whose successor is free too (the store cclctl's torch integration
    hosts beside torchrun's), both below the ephemeral range (tests/support/ports.py)."""
    return free_port_block(2)


__all__ = ["HERE", "PY", "Lines", "child_env", "free_port", "os", "run_job"]


#: The CLI and torchrun installed beside this Python (the tests' own virtual environment).
CCLCTL = str(Path(sys.executable).with_name("cclctl"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


@contextlib.contextmanager
def released_job(cmd: list[str], flags: Sequence[Path]) -> Iterator[subprocess.Popen[str]]:
    """Run a job that waits on the test; on the way out touch ``flags`` (its release) and
    stop it if it does not end by itself."""
    env = dict(os.environ, **child_env())
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        yield proc
    finally:
        for flag in flags:
            flag.touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def until_seen(
    what: str,
    check: Callable[[], Any],
    proc: subprocess.Popen[str],
    within_s: float,
    seen: Sequence[str] = (),
) -> Any:
    """Poll ``check`` until it gives something; fail the test if the job ends first or
    ``within_s`` passes (``seen``: what the checks last found, for the message)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the job ended before {what}: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.25)
    pytest.fail(
        f"no {what} within {within_s:g}s; the checks last saw: {list(seen)!r}; "
        f"the job's output: {_ended_output(proc)[-4000:]}"
    )


def _ended_output(proc: subprocess.Popen[str]) -> str:
    """What a job still running has printed, once it is stopped (its launcher passes the
    SIGTERM on to every rank)."""
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""
