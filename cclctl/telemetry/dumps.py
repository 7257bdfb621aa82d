"""Writing flight-recorder dumps: where, atomically, and when (signal, uncaught error, exit).

A dump must be readable even if the process dies while writing it, so it goes to a temporary
file in the same directory and is renamed over the final name. The triggers here only ever
call a ``dump`` callable; they never raise into the code they interrupt.

Every trigger dumps only in the process that installed it. A process forked from a rank (a
DataLoader worker, a ``multiprocessing`` pool) inherits the handlers and a copy of the
rank's recorder frozen at the fork, possibly with a lock held by a thread the child does not
have. Dumping there would hang on that lock, or write stale evidence under the rank's own
file name over the rank's real dump (a launcher stopping a job signals every process).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Protocol

from cclctl.errors import CclError, UsageError
from cclctl.telemetry import uncaught

log = logging.getLogger("cclctl.telemetry")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
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
UNCAUGHT, TERMINATED, EXIT_AFTER = "uncaught ", "terminated by ", "exit after "


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


def dump_filename(job: str, rank: int) -> str:
    """``cclctl-<job>-rank<r>.json``, with anything unsafe in a file name replaced by ``_``."""
    return f"cclctl-{_UNSAFE.sub('_', job) or 'job'}-rank{rank}.json"


#: Temporary files this process is writing now (a termination removes what it cuts short).
_WRITING: set[str] = set()


def tmp_prefix(pid: int | None = None) -> str:
    """``.cclctl-<host>-<pid>-``: whose a temporary file is, so a later run on this host
    can tell one left by a process that is gone (killed mid-write) from one being written."""
    host = _UNSAFE.sub("_", socket.gethostname()) or "host"
    return f".cclctl-{host}-{os.getpid() if pid is None else pid}-"


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half a file).

    A missing folder is made readable by its owner only (0700), as the file is (0600): a
    dump holds every thread's stack, and the job's folder its token. The temporary file is
    removed on every way out but a kill (:func:`remove_stale` clears those).
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=tmp_prefix(), suffix=".tmp")
    except OSError as exc:
        raise CclError(f"cannot write dump {path}: {exc.strerror or exc}", path=path) from None
    _WRITING.add(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise CclError(f"cannot write dump {path}: {exc.strerror or exc}", path=path) from None
    except BaseException:  # KeyboardInterrupt, SystemExit: no half-written file stays
        _remove_quietly(tmp)
        raise
    finally:
        _WRITING.discard(tmp)


def _cut_short() -> None:
    """Remove the temporary files of writes still under way (the process is ending)."""
    for tmp in list(_WRITING):
        _remove_quietly(tmp)


def _dead_writers_tmp(directory: str, names: list[str]) -> list[str]:
    """Temporary files in ``directory`` left by processes of this host that are gone."""
    head = re.escape(tmp_prefix(0)[: -len("0-")])  # .cclctl-<host>-
    owned = re.compile(f"^{head}([0-9]{{1,9}})-.*\\.tmp$")
    left = []
    for name in names:
        match = owned.match(name)
        if match and not _alive(int(match[1])):
            left.append(os.path.join(directory, name))
    return left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def remove_stale(directory: str, job: str, rank: int, world_size: int) -> list[str]:
    """Remove what an earlier run of ``job`` left in ``directory`` that this rank answers for
    (job names repeat: ``default``, ``bench``); returns the paths removed.

    Every rank removes its own file, so a rank that dies before it dumps is not read from an
    earlier run's document, and the temporary files of writers on this host that were killed
    mid-write (their pid is gone); rank 0 also removes the files of ranks ``world_size`` and
    beyond, which no rank of this run would replace.
    """
    mine = os.path.join(directory, dump_filename(job, rank))
    stale = [mine] if os.path.isfile(mine) else []
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    stale += _dead_writers_tmp(directory, names)
    if rank == 0:
        head = re.escape(dump_filename(job, 0)[: -len("0.json")])  # cclctl-<job>-rank
        numbered = re.compile(f"^{head}([0-9]+)\\.json$")
        found = (numbered.match(name) for name in names)
        stale += [os.path.join(directory, m[0]) for m in found if m and int(m[1]) >= world_size]
    removed = []
    for path in sorted(stale):
        try:
            os.unlink(path)
        except OSError:
            continue  # gone already, or not this user's to remove
        removed.append(path)
    return removed


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


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
            _cut_short()  # a dump still being written dies with the process: leave no part
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
