"""A rank's first moments: die with the launcher, then become the rank's command.

``cclctl launch`` starts each rank as ``python -I -S child_guard.py LAUNCHER_PID CMD...``.
It asks Linux to SIGKILL it when its parent goes (``prctl(PR_SET_PDEATHSIG)``; the setting
survives ``exec``), checks that its parent is still the launcher (a launcher killed before
that leaves no one to signal it), then ``exec``s the command in its own process: same pid,
same process group, so the launcher signals and reaps the rank as before. A rank that
ignores SIGTERM and prints nothing dies too when ``kill -9`` ends the launcher.

Linux sends the signal when the *thread* that forked the child ends, not the process: the
launcher forks every rank from the thread that then supervises them until they have all
ended, so that thread outlives them unless the whole launcher dies. ``preexec_fn`` could
do the same without this file, but it is unsafe in a process with threads.

This file runs as a script in isolated mode, so it imports the standard library only (never
cclctl: the rank's ``sys.path`` may not have it) and must stay importable as a module too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence

PR_SET_PDEATHSIG = 1
#: What ``exec`` failing exits with, as a shell does for a command it cannot run.
EXIT_CANNOT_RUN = 127


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent thread ends (Linux);
    False where the system has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True


def guarded(cmd: Sequence[str], launcher_pid: int) -> list[str]:
    """The command line that runs ``cmd`` behind this guard (``cmd`` itself off Linux)."""
    if not sys.platform.startswith("linux") or not sys.executable:
        return list(cmd)
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(launcher_pid), *cmd]


def check_runnable(program: str, env: Mapping[str, str]) -> None:
    """Raise the OSError ``exec`` would (FileNotFoundError, PermissionError, ...) for a
    program that cannot run, so the launcher says so before any rank starts."""
    if os.sep not in program:
        if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        return
    os.stat(program)  # FileNotFoundError, NotADirectoryError
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


def main(argv: list[str]) -> None:
    """``LAUNCHER_PID CMD [ARG...]``: guard this process, then ``exec`` CMD."""
    launcher, cmd = int(argv[0]), argv[1:]
    set_parent_death_signal()
    if os.getppid() != launcher:  # it died before the guard was set: follow it now
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        sys.stderr.write(f"cclctl: cannot run {cmd[0]!r}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        os._exit(EXIT_CANNOT_RUN)


if __name__ == "__main__":
    main(sys.argv[1:])
