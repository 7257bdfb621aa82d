"""Whether a peer's process on this host is gone, and how it ended: a dead rank named with
its signal (``SIGKILL``) instead of "the link broke".

Only a parent can wait for a child's status, but a zombie's ``/proc/<pid>/stat`` still
holds its exit code until the parent reaps it, so a peer that died a moment ago often
shows its signal; once reaped, all that is left to say is that its process exited.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

from cclctl.host_status import PROC_GONE, PROC_STOPPED, PROC_ZOMBIE

GONE = "process exited"

#: A dying process closes its sockets before it turns zombie: how long a rank whose link
#: to a peer on this host broke watches for that peer's exit before calling it a link fault.
PEER_EXIT_GRACE_S = 0.1


def exit_reason(pid: int) -> str | None:
    """None while ``pid`` runs (or is stopped); else how it ended: ``SIGKILL``, ``exit code
    1`` or :data:`GONE`. Raises nothing: an unreadable table reads as alive."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return GONE
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] not in (b"Z", b"X"):
        return None
    try:
        status = int(fields[-1])  # exit_code (field 52, Linux 3.5+): the wait status
    except ValueError:
        return GONE
    return describe_status(status)


def gone_within(pid: int, grace_s: float) -> str | None:
    """How ``pid`` ended if it is gone or goes within ``grace_s``; None if it lives on."""
    found = first_gone([pid], grace_s)
    return None if found is None else found[1]


def first_gone(pids: Sequence[int], grace_s: float) -> tuple[int, str] | None:
    """The first of ``pids`` that is gone or goes within ``grace_s``, and how it ended."""
    deadline = time.monotonic() + grace_s
    while True:
        for pid in pids:
            gone = exit_reason(pid)
            if gone is not None:
                return pid, gone
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def process_state(pid: int) -> str:
    """``pid``'s state letter in ``/proc`` (``R``, ``S``, ``T``, ``Z``...), or empty."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0].decode() if fields else ""


def looked_at(pid: int) -> str | None:
    """What a host agent says of its rank's process ``pid``: ``stopped`` (state T or t),
    ``zombie``, ``gone``, or None while it runs (or cannot be read)."""
    if pid <= 0:
        return None
    state = process_state(pid)
    if state in ("T", "t"):
        return PROC_STOPPED
    if state == "Z":
        return PROC_ZOMBIE
    if state == "X" or (not state and not os.path.exists(f"/proc/{pid}")):
        return PROC_GONE
    return None


def describe_status(status: int) -> str:
    """A wait status in words: ``SIGKILL`` or ``exit code 3``."""
    if os.WIFSIGNALED(status):
        return signal_name(os.WTERMSIG(status))
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return GONE


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
