"""When a process writes its flight-recorder dumps: on a signal, an uncaught error, a
termination or an exit after errors (how a file is written: :mod:`.dump_files`).

The triggers here only ever call a ``dump`` callable; they never raise into the code they
interrupt.

Every trigger dumps only in the process that installed it. A process forked from a rank (a
DataLoader worker, a ``multiprocessing`` pool) inherits the handlers and a copy of the
rank's recorder frozen at the fork, possibly with a lock held by a thread the child does not
have. Dumping there would hang on that lock, or write stale evidence under the rank's own
file name over the rank's real dump (a launcher stopping a job signals every process).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Protocol

from cclctl.endings import ENDING_TERMINATED, ENDING_UNCAUGHT, ENDING_WORDS
from cclctl.errors import UsageError
from cclctl.telemetry import dump_files, uncaught

log = logging.getLogger("cclctl.telemetry")

#: The functions below that dump from the thread they interrupt: a dump's stacks leave
#: them, and all they call, out (see cclctl.telemetry.stack_capture).
TRIGGERS = frozenset(("handler", "hook", "at_exit"))


class Dumpable(Protocol):
    """What the triggers need: a way to dump, a count of failures seen so far and how many
    of them a retry re-ran (see :meth:`cclctl.telemetry.recorder.Recorder.recovered`)."""

    def dump(self, reason: str, path: str | None = None) -> str | None: ...

    def failures(self) -> int: ...

    def recovered(self) -> int: ...


#: The reasons of the dumps a process writes as it ends (its last word on what happened).
UNCAUGHT, TERMINATED = ENDING_WORDS[ENDING_UNCAUGHT], ENDING_WORDS[ENDING_TERMINATED]
EXIT_AFTER = "exit after "


def ends_process(reason: str) -> bool:
    """Whether a dump with ``reason`` is the one a process writes as it ends: no dump begun
    for another reason (a revocation's, on its own thread) may replace it."""
    return reason.startswith((UNCAUGHT, TERMINATED, EXIT_AFTER))


def exit_reason(failures: int, recovered: int) -> str:
    """Why a process that exits after ``failures`` (``recovered`` of them re-run by a
    retry) dumps: "exit after errors" while any stayed failed, else what a retry undid, so
    a job that rode through a link fault does not read as one that failed."""
    if failures > recovered:
        return f"{EXIT_AFTER}errors"
    attempts = "attempt" if recovered == 1 else "attempts"
    return f"{EXIT_AFTER}recovered errors ({recovered} failed {attempts} re-run by a retry)"


def _forked(owner: int) -> bool:
    """Whether this process is a fork of ``owner`` (the pid that installed a trigger)."""
    return os.getpid() != owner


def dump_quietly(target: Dumpable, reason: str, directory: str | None) -> str | None:
    """Dump and log instead of raising: used where an exception would hurt the job."""
    try:
        return target.dump(reason, directory)
    except Exception as exc:  # a trigger must never take the process down
        log.warning("cclctl: flight recorder dump failed: %s", exc)
        return None


def install_signal_dump(
    target: Dumpable, directory: str | None, signum: int = signal.SIGUSR1
) -> Callable[[], None]:
    """Dump on ``signum`` (``kill -USR1 <pid>``); returns a function that restores the old handler.

    The handler only starts a thread: the main thread may be interrupted while it holds the
    recorder's lock, so dumping inline could deadlock. A previous Python handler is chained.
    """
    if threading.current_thread() is not threading.main_thread():
        raise UsageError("the dump signal handler can only be installed from the main thread")
    name = signal.Signals(signum).name
    owner = os.getpid()

    def handler(sig: int, frame: FrameType | None) -> None:
        if not _forked(owner):
            threading.Thread(
                target=dump_quietly, args=(target, f"signal {name}", directory), name="cclctl-dump"
            ).start()
        if callable(previous):
            previous(sig, frame)

    previous = signal.signal(signum, handler)

    def restore() -> None:
        if signal.getsignal(signum) is handler:
            signal.signal(signum, previous)

    return restore


def install_termination_dump(
    target: Dumpable, directory: str | None, signum: int = signal.SIGTERM, wait_s: float = 2.0
) -> Callable[[], None]:
    """Dump when the process is told to terminate, then terminate as it would have.

    A launcher stops the other ranks as soon as one fails; without this, the ranks that saw
    nothing wrong (often the culprits) would leave no evidence. The dump runs in a thread that
    the handler waits for at most ``wait_s``, so a lock held by the interrupted main thread can
    delay termination but never prevent it.
    """
    if threading.current_thread() is not threading.main_thread():
        raise UsageError("the termination dump can only be installed from the main thread")
    name = signal.Signals(signum).name
    owner = os.getpid()

    def handler(sig: int, frame: FrameType | None) -> None:
        if not _forked(owner):
            worker = threading.Thread(
                target=dump_quietly,
                args=(target, f"{TERMINATED}{name}", directory),
                name="cclctl-dump",
                daemon=True,
            )
            worker.start()
            worker.join(wait_s)
            dump_files.cut_short()  # a dump being written dies with the process: no part
        signal.signal(signum, previous)
        if callable(previous):
            previous(sig, frame)
        else:
            os.kill(os.getpid(), signum)

    previous = signal.signal(signum, handler)

    def restore() -> None:
        if signal.getsignal(signum) is handler:
            signal.signal(signum, previous)

    return restore


def install_exit_dump(
    target: Dumpable, directory: str | None, brief_errors: bool = False
) -> Callable[[], None]:
    """Dump when the process dies of an uncaught exception, or exits after errors or hangs
    (the reason says whether a retry recovered every one: :func:`exit_reason`).

    Chains ``sys.excepthook``; with ``brief_errors`` an uncaught cclctl error is printed as
    its one line instead of a traceback (:mod:`cclctl.telemetry.uncaught`). The ``atexit``
    part skips the dump when nothing went wrong or the excepthook already wrote one.
    Returns a function that uninstalls both.
    """
    previous_hook = sys.excepthook
    dumped = threading.Event()
    owner = os.getpid()

    def hook(etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not _forked(owner) and dump_quietly(
            target, f"{UNCAUGHT}{etype.__name__}: {value}", directory
        ):
            dumped.set()
        uncaught.report(etype, value, tb, previous_hook, brief_errors)

    def at_exit() -> None:
        if _forked(owner) or dumped.is_set():
            return
        failures = target.failures()
        if failures > 0:
            dump_quietly(target, exit_reason(failures, target.recovered()), directory)

    sys.excepthook = hook
    atexit.register(at_exit)

    def uninstall() -> None:
        atexit.unregister(at_exit)
        if sys.excepthook is hook:
            sys.excepthook = previous_hook

    return uninstall
