"""How a store that outlives the rank which started it ends: a grace after the last rank.

A detached job store (see :mod:`cclctl.store.detached`) serves while any rank is connected
and for ``seconds`` after the last one left (or after it started, if none came: at least
``first_rank_s`` then, which a launcher's store, started before its ranks, asks for), so
``cclctl top`` and ``cclctl diagnose hang --store`` still answer once the job died; readers
never keep it alive. It also keeps its own counts (what it turned away) under a key of the
job, where the rank that started it reads them for its metrics. Once its last rank left it
marks itself ended (``ENDED_KEY``): a rerun's ranks that reach it then wait for the store
their own rank 0 starts once this one has left (see ``runtime/job/store_retire.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import Protocol

from cclctl.store.protocol import Op
from cclctl.store.state import StoreState


class LingeringStore(Protocol):
    """What the grace needs of a store: its keys, address, membership and counts, its clock,
    a way to stop it, and its mark that its job is over."""

    ended: bool

    @property
    def state(self) -> StoreState: ...
    @property
    def address(self) -> str: ...
    @property
    def members(self) -> int: ...
    @property
    def member_left(self) -> float: ...
    @property
    def rejected(self) -> dict[str, int]: ...
    @property
    def refused(self) -> int: ...
    def now(self) -> float: ...
    def stop_serving(self) -> None: ...


#: Set (outside every job's scope) once a lingering store's last rank left.
ENDED_KEY = "cclctl/store/ended"
#: The least a launcher's store waits for its first rank: the ranks of a loaded machine
#: take a while to start, and the ones that came after the grace found no store.
FIRST_RANK_S = 60.0


@dataclasses.dataclass(frozen=True)
class Linger:
    """Serve ``seconds`` past the last rank (at least ``first_rank_s`` past the start while
    none came); publish the store's counts under ``report_key``."""

    seconds: float
    report_key: str = ""
    first_rank_s: float = 0.0

    @property
    def tick_s(self) -> float:
        """How often membership is looked at: a quarter of the grace, within 50 ms .. 1 s."""
        return min(1.0, max(0.05, self.seconds / 4))


def report(server: LingeringStore, linger: Linger) -> bytes:
    """What the store says about itself: its pid, address, grace and what it turned away."""
    return json.dumps(
        {
            "pid": os.getpid(),
            "address": server.address,
            "linger_s": linger.seconds,
            "members": server.members,
            "rejected": server.rejected,
            "refused": server.refused,
        },
        sort_keys=True,
    ).encode()


async def watch(server: LingeringStore, linger: Linger) -> None:
    """On the store's loop: stop the server ``linger.seconds`` after it last had a rank
    (at least ``linger.first_rank_s`` after it started, while no rank came)."""
    last_member = server.now()
    published = b""
    came = False
    while True:
        now = server.now()
        if server.members:
            last_member = now
            came = True
        came = came or bool(server.member_left)
        last_member = max(last_member, server.member_left)  # to the moment, not the tick
        grace = linger.seconds if came else max(linger.seconds, linger.first_rank_s)
        if not server.members and now - last_member >= grace:
            server.stop_serving()
            return
        if linger.report_key:
            current = report(server, linger)
            if current != published:
                server.state.apply(Op.SET, [linger.report_key.encode(), current])
                published = current
        await asyncio.sleep(linger.tick_s)


def mark_ended(server: LingeringStore) -> None:
    """On the loop: the store's last rank left; ranks that come now belong to a later run."""
    server.ended = True
    server.state.apply(Op.SET, [ENDED_KEY.encode(), b"1"])
