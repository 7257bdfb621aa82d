"""Job-wide requests through the store: "every rank, dump your flight recorder now".

When one rank's watchdog sees a hang, the ranks that matter most are often the ones that
see nothing: a rank stuck in its own code never times out. A dump request in the store makes
every live rank write its dump within about a second, so the post-mortem has the whole job.
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

from cclctl.errors import CclError
from cclctl.periodic import Periodic

log = logging.getLogger("cclctl.signals")
DUMP_KEY = "signal/dump"


class SignalStore(Protocol):
    def add(self, key: str, delta: int) -> int: ...
    def set(self, key: str, value: bytes) -> None: ...
    def try_get(self, key: str) -> bytes | None: ...


class Dumper(Protocol):
    def dump(self, reason: str, path: str | None = None) -> str | None: ...


def request_dump(store: SignalStore, rank: int, reason: str) -> None:
    """Ask every rank of the job to dump (counted, so each request is acted on once)."""
    try:
        store.set(f"{DUMP_KEY}/why", json.dumps({"rank": rank, "reason": reason}).encode())
        store.add(f"{DUMP_KEY}/count", 1)
    except CclError as exc:
        log.warning("cclctl: could not ask the other ranks to dump: %s", exc)


class DumpRequests:
    """A daemon thread that dumps this rank's flight recorder when the job asks."""

    def __init__(
        self, store: SignalStore, dumper: Dumper, rank: int, interval_s: float = 1.0
    ) -> None:
        self._store = store
        self._rank = rank
        self._dumper = dumper
        # The requests counted at the first look are older than this rank: not its to
        # answer. The first look is on the thread, an interval after the start, when a rank
        # its host agent serves has the agent's answer to read it from (no store connection).
        self._seen: int | None = None
        # a CclError: the store may be restarting or gone; try again next turn
        self._thread = Periodic("cclctl-dump-requests", self._turn, interval_s, quiet=(CclError,))

    def start(self) -> DumpRequests:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()

    def _count(self) -> int:
        raw = self._store.try_get(f"{DUMP_KEY}/count")
        return int(raw) if raw else 0

    def poll(self) -> bool:
        """Dump once if a new request arrived since the last poll."""
        count = self._count()
        if self._seen is None:
            self._seen = count
            return False
        if count <= self._seen:
            return False
        self._seen = count
        why = self._store.try_get(f"{DUMP_KEY}/why") or b"{}"
        try:
            info = json.loads(why)
            reason = f"requested by rank {info['rank']}: {info['reason']}"
            if info["rank"] == self._rank:
                return False  # our own watchdog asked, and it has dumped already
        except (ValueError, KeyError, TypeError):
            reason = "requested by another rank"
        self._dumper.dump(reason)
        return True

    def _turn(self) -> None:
        self.poll()
