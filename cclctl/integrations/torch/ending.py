"""How a torch rank that ends badly leaves its evidence: always, with no setup.

A rank under ``cclctl run`` dumps into the job's folder (:attr:`Telemetry.dump_dir`: the
``--trace-dir`` when given) when it dies of an uncaught exception, exits after failed calls,
or is told to stop. torchrun stops the survivors with SIGTERM as soon as it sees one worker
gone, every ``--monitor-interval`` (0.1 s by default): often before any survivor's gloo call
failed, so before any survivor named the dead rank. So a SIGTERM here first does what a
failed call would: a rank's process gone on this host is the job's failure, written in its
revoke record (:meth:`~cclctl.integrations.torch.revoke.TorchRevoke.on_stopped`). Then the
rank's last status says why it ends (``terminated by SIGTERM``, ``uncaught RuntimeError:
...``, :attr:`Telemetry.exit_reason`), never "closed" (a clean finish), and it dumps.

The exit triggers are :mod:`cclctl.telemetry.dumps`'s; :class:`Ending` is what they call.
The SIGTERM handler is :class:`Termination`: it never makes the main thread wait. The main
thread it interrupts may be inside a store request, or hold the lock of the revoke record
it is adopting, that the naming needs (a handler that waited for the dump thread there
waited out its whole bound, and the rank died without its last status); so the handler
only starts a thread, which names, publishes, dumps and then ends the process by the
signal, as it would have ended.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from cclctl.endings import ENDING_TERMINATED, ending_of
from cclctl.records import CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.telemetry import dumps
from cclctl.telemetry.hub import Telemetry

log = logging.getLogger("cclctl.torch")

#: How the reason a SIGTERM's dump gives begins (:mod:`cclctl.telemetry.dumps`).
TERMINATED = dumps.TERMINATED
#: How long a SIGTERM waits for the naming, the last status and the dump before the rank
#: terminates anyway: torchrun waits 30 s after its SIGTERM before it kills.
TERMINATION_WAIT_S = 10.0


class Namer(Protocol):
    """What a SIGTERM asks of the rank's revoke end (see
    :meth:`~cclctl.integrations.torch.revoke.TorchRevoke.on_stopped`)."""

    @property
    def record(self) -> Revocation | None: ...

    def on_stopped(self, rec: CollectiveRecord | None) -> Revocation | None: ...


class Ending:
    """The :class:`~cclctl.telemetry.dumps.Dumpable` the exit and termination triggers call:
    ``telemetry``'s, naming the failure with ``namer()`` (None: no revoke end)."""

    def __init__(self, telemetry: Telemetry, namer: Callable[[], Namer | None]) -> None:
        self.telemetry = telemetry
        self._namer = namer

    def failures(self) -> int:
        return self.telemetry.failures()

    def recovered(self) -> int:
        return self.telemetry.recovered()

    def dump(self, reason: str, path: str | None = None) -> str | None:
        """Say why this rank ends (its revoke record first, on a SIGTERM), then dump."""
        tel = self.telemetry
        ending = ending_of(reason)  # the triggers word it (:mod:`cclctl.telemetry.dumps`)
        if ending and not tel.exit_reason:
            tel.exit_reason = reason
        if ending == ENDING_TERMINATED:
            self._name_the_failure()
        if ending:
            tel.publish_now()
        return tel.dump(reason, path)

    def _name_the_failure(self) -> None:
        revoke = self._namer()
        if revoke is None or revoke.record is not None:
            return
        inflight = self.telemetry.inflight()
        revoke.on_stopped(inflight[0] if inflight else None)


class Termination:
    """On ``signum``: in a thread, ``target.dump("terminated by SIG...")`` (at most
    ``wait_s``), then end as the handler before this one would have (see the module doc).
    A process forked from the rank passes the signal straight on."""

    def __init__(self, target: Ending, signum: int = signal.SIGTERM, wait_s: float = 10.0):
        self.target = target
        self.signum = signum
        self.wait_s = wait_s
        self.reason = f"{TERMINATED}{signal.Signals(signum).name}"
        self._owner = os.getpid()
        self._started = False
        self._done = False
        self.previous: Any = signal.signal(signum, self.handler)

    def handler(self, sig: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner or self._done:
            self._pass_on(sig, frame)
        elif not self._started:
            self._started = True
            threading.Thread(target=self._end, name="cclctl-ending", daemon=True).start()

    def _end(self) -> None:
        worker = threading.Thread(
            target=dumps.dump_quietly,
            args=(self.target, self.reason, None),
            name="cclctl-dump",
            daemon=True,
        )
        worker.start()
        worker.join(self.wait_s)
        self._done = True
        if not callable(self.previous):
            # the default action, from this thread: the main thread may sit in a gloo
            # call for long, and only it runs Python's signal handlers
            _default_action(self.signum)
        os.kill(os.getpid(), self.signum)  # the main thread chains the job's own handler

    def _pass_on(self, sig: int, frame: FrameType | None) -> None:
        signal.signal(sig, self.previous)
        if callable(self.previous):
            self.previous(sig, frame)
        else:
            os.kill(os.getpid(), sig)

    def restore(self) -> None:
        if signal.getsignal(self.signum) == self.handler:
            signal.signal(self.signum, self.previous)


def _default_action(signum: int) -> None:
    """Put ``signum`` back to its default action at the C level (any thread may)."""
    try:
        ctypes.pythonapi.PyOS_setsig.restype = ctypes.c_void_p
        ctypes.pythonapi.PyOS_setsig.argtypes = [ctypes.c_int, ctypes.c_void_p]
        ctypes.pythonapi.PyOS_setsig(signum, signal.SIG_DFL.value)
    except (AttributeError, OSError):  # then the main thread ends it, once it runs Python
        pass


def install(tel: Telemetry, namer: Callable[[], Namer | None]) -> list[Callable[[], None]]:
    """Dump ``tel`` on SIGUSR1 (and keep running), on SIGTERM, after an uncaught exception
    and at an exit after failed calls; main thread only (else nothing). Returns the undo
    functions."""
    if threading.current_thread() is not threading.main_thread():
        return []
    ending = Ending(tel, namer)
    try:
        undo = [dumps.install_signal_dump(tel, None), dumps.install_exit_dump(ending, None)]
        if signal.getsignal(signal.SIGTERM) != signal.SIG_IGN:  # a job that ignores it runs on
            undo.append(Termination(ending, wait_s=TERMINATION_WAIT_S).restore)
        return undo
    except (ValueError, OSError) as exc:  # an embedding that forbids signal handlers
        log.warning("cclctl: this rank dumps only on request: %s", exc)
        return []
