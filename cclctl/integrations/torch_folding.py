"""A torch session's records are counted by a thread of its own, not by the calls.

Why: cclctl's runtime folds on the calling thread every ``FOLD_BATCH`` calls, because its
transport waits by spinning in that thread and leaves no idle time to fold in. A
torch.distributed call waits in the backend with the GIL released instead, so a thread that
folds now and then (every ``FOLD_PERIOD_S``) mostly runs while the caller waits, and the
caller keeps the time. On 2 pinned gloo ranks at 8 B that took the main thread's CPU per
wrapped call from +4.7-4.9 to +4.0-4.3 us over plain torch (``benchmarks/torch_overhead.py``,
three runs of each, alternating); on those 2 cores the wall clock did not move measurably,
and on hosts with cores to spare the fold leaves the caller's core altogether. Calls still
fold every ``FOLD_BACKSTOP`` calls themselves, so the queue stays bounded should this
thread starve.

Every second, or sooner once a group has made ``FOLD_WAKE_CALLS`` calls (the calling
thread wakes the folder then): readers fold for themselves, so a longer period costs nothing
in freshness, and each wake-up takes the rank's core and the GIL from the backend for a
moment. On 2 pinned gloo ranks a wake-up now and then turns a quick 1 MiB call into a slow
one (gloo's 1 MiB calls there take ~0.4 ms or ~3.7 ms, see benchmarks/torch_per_call.py):
folding every 10 ms cost +2.23% and +4.07% at 1 MiB against +1.52% and +1.47% every 100 ms
(``torch_overhead.py``, alternating), and every second +0.95% [-0.20, +2.08] against
+1.96% [+0.73, +3.20] every 100 ms (``torch_per_call.py --rounds 1200 --pin``, one run of
each, back to back; wrapped calls drew slow ones 0.003 more often than plain ones, against
0.007). Waking by count keeps a fast job's queue (8 B calls come ~7,000 a second here) far
from the backstop. The price is in :mod:`~cclctl.integrations.torch_session`: a quick
call's tensor is kept until its record is built, now up to a second.
"""

from __future__ import annotations

from typing import Protocol

from cclctl.periodic import Periodic
from cclctl.telemetry.recorder import FOLD_BATCH

#: Seconds between the folder's looks (see the module's docstring).
FOLD_PERIOD_S = 1.0
#: Every this many calls of a group (by seq) the calling thread wakes the folder.
FOLD_WAKE_CALLS = 4 * FOLD_BATCH
#: Every this many calls (by seq) the calling thread folds itself: the folder may starve.
FOLD_BACKSTOP = 16 * FOLD_BATCH


class Foldable(Protocol):
    def queued(self) -> int: ...
    def fold(self) -> None: ...


class Folder:
    """The thread that folds one session's telemetry (see the module's docstring)."""

    def __init__(self, telemetry: Foldable, period_s: float = FOLD_PERIOD_S) -> None:
        self._telemetry = telemetry
        self._thread = Periodic("cclctl-torch-fold", self._turn, period_s)

    def start(self) -> Folder:
        self._thread.start()
        return self

    def wake(self) -> None:
        """Fold now: the calling thread has made ``FOLD_WAKE_CALLS`` calls since the last."""
        self._thread.wake()

    def stop(self) -> None:
        self._thread.stop()

    def _turn(self) -> None:
        """Fold if anything waits (a failed fold is logged; the next one, or a reader's,
        counts what it did not).
        """
        if self._telemetry.queued():
            self._telemetry.fold()
