"""A daemon thread that does one job every so often, until stopped.

The watchdog, the status publisher, the dump-request poller and a torch session's folder each
run one. They serve telemetry, which must never be why a job stops: a turn that raises is
logged and the thread goes on, and ``stop()`` waits a bounded time. Standard library only,
so every layer can use it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("cclctl")

#: How long :meth:`Periodic.stop` waits for the thread (and its last turn) by default.
STOP_TIMEOUT_S = 5.0


class Periodic:
    """Runs ``turn()`` every ``period_s`` seconds on a daemon thread named ``name``.

    ``turn`` may return the seconds to wait before the next turn (None: ``period_s``), so
    a thread can slow down while there is nothing to do. ``first``/``last`` add a turn as
    soon as the thread starts and one after :meth:`stop` (a final status, say).
    ``quiet`` exceptions are expected now and then (a store restarting) and are not logged.
    """

    def __init__(
        self,
        name: str,
        turn: Callable[[], float | None],
        period_s: float,
        *,
        first: bool = False,
        last: bool = False,
        quiet: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.name = name
        self.period_s = period_s
        self._turn = turn
        self._first = first
        self._last = last
        self._quiet = quiet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop after the current turn (and the last one, if asked); idempotent, and safe
        from the thread itself (a turn that stops its own thread)."""
        self._stop.set()
        thread = self._thread
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        asked = self._safe_turn() if self._first else None
        while not self._stop.wait(self.period_s if asked is None else asked):
            asked = self._safe_turn()
        if self._last:
            self._safe_turn()

    def _safe_turn(self) -> float | None:
        try:
            return self._turn()
        except self._quiet:
            return None
        except Exception:  # the thread must outlive any one bad turn
            log.exception("cclctl: %s failed", self.name)
            return None
