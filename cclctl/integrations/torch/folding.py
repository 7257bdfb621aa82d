"""A torch session's records are counted by a thread of its own, not by the calls.

cclctl's runtime folds on the calling thread every ``FOLD_BATCH`` calls, because its
transport waits by spinning in that thread and leaves no idle time to fold in. A
torch.distributed call waits in the backend with the GIL released instead, so a thread that
folds now and then (every ``FOLD_PERIOD_S``) mostly runs while the caller waits, and the
caller keeps the time. Calls still fold themselves, so the queue stays bounded should this
thread starve: a record that closes folds every ``FOLD_BACKSTOP`` calls of its group.

The period is long (100 ms): readers fold for themselves, so a longer period costs nothing
in freshness, and each wake-up takes the rank's core and the GIL from the backend.
"""

from __future__ import annotations

from typing import Protocol

from cclctl.periodic import Periodic
from cclctl.telemetry.recorder import FOLD_BATCH

#: Seconds between folds while calls are being made (see the module's docstring).
FOLD_PERIOD_S = 0.1
#: Seconds between looks while nothing was queued (the job is between steps, or done).
IDLE_PERIOD_S = 0.5
#: How far behind a call lets the folder fall before it folds itself (see above).
FOLD_BACKSTOP = 16 * FOLD_BATCH


class Foldable(Protocol):
    def queued(self) -> int: ...
    def fold(self) -> None: ...


class Folder:
    """The thread that folds one session's telemetry (see the module's docstring)."""

    def __init__(
        self, telemetry: Foldable, period_s: float = FOLD_PERIOD_S, idle_s: float = IDLE_PERIOD_S
    ) -> None:
        self._telemetry = telemetry
        self._idle_s = idle_s
        self._thread = Periodic("cclctl-torch-fold", self._turn, period_s)

    def start(self) -> Folder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()

    def _turn(self) -> float | None:
        """Fold if anything waits (a failed fold is logged; the next one, or a reader's,
        counts what it did not); look again in ``period_s``, or ``idle_s`` if nothing did.
        """
        if not self._telemetry.queued():
            return self._idle_s
        self._telemetry.fold()
        return None
