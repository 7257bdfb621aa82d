"""The examples in `cclctl launch --help` run: a bench command in them is one bench accepts."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from cclctl.commands.launch import EPILOG

BENCH_EXAMPLES = [
    shlex.split(line.split(" -- ", 1)[1])
    for line in EPILOG.splitlines()
    if line.strip().startswith("cclctl launch") and " -- cclctl bench" in line
]


def test_the_help_has_a_bench_example() -> None:
    assert BENCH_EXAMPLES


@pytest.mark.timeout(120)
@pytest.mark.parametrize("example", BENCH_EXAMPLES, ids=" ".join)
def test_the_bench_example_is_accepted(example: list[str]) -> None:
    """The example's flags, made small (later flags win): bench runs it and exits 0."""
    tiny = ["-g", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]
    cmd = [sys.executable, "-m", "cclctl", *example[1:], *tiny]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
