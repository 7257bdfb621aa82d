"""How a collective ends on a rank where a recovery policy asks more of its end than that
its result is whole (a retry's confirm: :class:`~cclctl.runtime.comm.rerun.Ending`), and
what the call's memory may then lend its links.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from cclctl.runtime.algorithms.context import Step


class Ending(Protocol):
    """Run in a call's step once its result is whole."""

    #: it returns on no rank before every rank's result is whole (a one-byte barrier)
    confirm: bool

    def __call__(self, step: Step) -> None: ...


def settle(step: Step, dst: np.ndarray, ending: Ending | None) -> None:
    """Tell ``step``'s links that an all_gather's or a broadcast's output ``dst`` holds
    nothing but final bytes once written (every algorithm of theirs sends from it and writes
    each byte once) until every rank holds its result, where the call ends with a confirm:
    so the unacknowledged end of a message sent from it needs no copy for a resume
    (``Wait.settled``)."""
    if ending is not None and ending.confirm and dst.nbytes:
        step.wait.settled = (dst.ctypes.data, dst.ctypes.data + dst.nbytes)
