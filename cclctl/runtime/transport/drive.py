"""The one loop that runs a step to completion over one transport's share or several.

Every share moves what it can without blocking; only when none moved does the loop block.
A share alone waits its own way (``poll`` on sockets, a futex sleep on shared memory). Beside
others the loop cannot sleep on all of them at once, so it checks the others for a failed
peer and blocks on the last share for a short slice, then looks at every share again: list
the share that waits on file descriptors (TCP) last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cclctl.runtime.transport.base import Progress, Transfer, Wait

MIXED_SLICE_S = 0.001  # with several shares stuck: how long to block on the last one


def drive(shares: Sequence[Progress], wait: Wait) -> None:
    """Advance ``shares`` until every one is done, blocking only when none can move."""
    if len(shares) == 1:
        _drive_one(shares[0], wait)
        return
    live = [share for share in shares if not share.done]
    while live:
        moved = False
        for share in live:
            if share.advance():
                moved = True
        live = [share for share in live if not share.done]
        if moved or not live:
            continue
        if len(live) == 1:
            _block(live[0], wait, None)
            continue
        for share in live[:-1]:
            share.check()
        _block(live[-1], wait, MIXED_SLICE_S)


def _drive_one(share: Progress, wait: Wait) -> None:
    while not share.done:
        if not share.advance() and not share.done:
            _block(share, wait, None)


def _block(share: Progress, wait: Wait, slice_s: float | None) -> None:
    peer, what = share.waiting_on()
    wait.blocked_on(peer, what)
    share.block(wait, peer, what, slice_s)


class DrivenAlone:
    """``exchange`` for a transport that drives its own steps: start one, drive it."""

    def start(
        self, call: Any, step: int, sends: Sequence[Transfer], recvs: Sequence[Transfer], wait: Wait
    ) -> Progress:
        raise NotImplementedError

    def exchange(
        self, call: Any, step: int, sends: Sequence[Transfer], recvs: Sequence[Transfer], wait: Wait
    ) -> None:
        drive((self.start(call, step, sends, recvs, wait),), wait)
