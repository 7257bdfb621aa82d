"""Run real torch.distributed (gloo) jobs for the tests: N local ranks through cclctl's
launcher, which sets torchrun's variables, stops every rank on failure or timeout and
leaves no process behind.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

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


def free_port() -> int:
    """A free TCP port on loopback, whose successor is free too (cclctl's store uses it)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            try:
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no pair of free ports")


def child_env(**extra: str) -> dict[str, str]:
    """Variables for jobs: quiet torch warnings, plus ``extra``."""
    env = {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


__all__ = ["HERE", "PY", "Lines", "child_env", "free_port", "os", "run_job"]
