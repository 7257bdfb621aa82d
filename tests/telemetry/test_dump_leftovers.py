"""A dump's temporary file is removed on every way out: an exception, a termination that
cuts the dump short, and (for a writer killed mid-write) the next run of the folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cclctl.telemetry import dump_files


def leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))


def test_an_exception_mid_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dump_files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dump_files.write_atomic(str(tmp_path / "d.json"), "{}")
    assert leftovers(tmp_path) == []


TERMINATED_MID_DUMP = textwrap.dedent(
    """
    import os, sys, threading
    from cclctl.telemetry import dump_files, dumps

    folder = sys.argv[1]
    writing = threading.Event()

    class Stuck:
        def dump(self, reason, path=None):
            def slow_fdopen(*a, **k):  # the file exists; its write never ends
                writing.set()
                threading.Event().wait()
            dump_files.os.fdopen = slow_fdopen
            dump_files.write_atomic(os.path.join(folder, "cclctl-j-rank0.json"), "{}")
        def failures(self):
            return 0

    dumps.install_termination_dump(Stuck(), folder, wait_s=0.5)
    os.kill(os.getpid(), 15)
    """
)


@pytest.mark.timeout(60)
def test_a_termination_that_cuts_a_dump_short_removes_its_temporary_file(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", TERMINATED_MID_DUMP, str(tmp_path)],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert out.returncode == -signal.SIGTERM, out.stderr
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(60)
def test_the_next_run_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"{dump_files.tmp_prefix(int(gone.stdout))}abc.tmp"
    mine = tmp_path / f"{dump_files.tmp_prefix()}def.tmp"  # being written by a live process
    other_host = tmp_path / f".cclctl-elsewhere-{int(gone.stdout)}-ghi.tmp"
    for path in (dead, mine, other_host):
        path.write_text("")
    removed = dump_files.remove_stale(str(tmp_path), "j", 1, 4)
    assert removed == [str(dead)]
    assert leftovers(tmp_path) == sorted([mine.name, other_host.name])
