"""A rank's SIGTERM handler (integrations/torch/ending.py) never makes the main thread wait:
the thread it interrupts may hold what the dump needs (a store connection inside a request,
the revoke record's lock), and a handler that waited there for the dump waited out its
whole bound and ended the rank without its last status or dump."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys, threading, time
from cclctl.integrations.torch.ending import Termination

lock = threading.Lock()  # as a store connection the main thread is using

class Target:
    def failures(self):
        return 0

    def dump(self, reason, path=None):
        print("dumping", flush=True)
        with lock:
            open(sys.argv[1], "w").write(reason)
        return sys.argv[1]

Termination(Target(), wait_s=30)
with lock:
    print("ready", flush=True)
    sys.stdin.readline()  # the main thread's request, answered once the test says so
time.sleep(120)  # the rest of the step: the signal ends it
"""


@pytest.mark.timeout(90)
def test_sigterm_dumps_what_the_interrupted_main_thread_holds_then_ends_by_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "dump.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "dumping"  # its thread waits on the lock
        proc.stdin.write("answer\n")
        proc.stdin.flush()  # the main thread goes on and lets go of the lock
        assert proc.wait(timeout=60) == -signal.SIGTERM  # ended by the signal, as it would
        assert out.read_text() == "terminated by SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
