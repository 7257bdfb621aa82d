"""The host agent's part in its ranks' transport meeting after a fan-in rendezvous
(:mod:`.meet_keys`; the rank's side: :mod:`cclctl.runtime.job.fanin_meeting`).

A rank that joined through the agent sends it one frame per step of the meeting, on its
rendezvous socket (``{"meet": "addr" | "segments" | "mapped", "rank", "key", "local",
"world_size", "timeout_s", "value"}``: ``local`` folds the ranks of its host key, from the
world document). The agent gathers the frames of one step and one host key, a *round*,
until every rank of ``local`` is in, or :data:`GATHER_S` (at most a quarter of the
timeout) after the first came:

- ``addr``: one compare-and-set of the host key's address document with the gathered
  ranks' addresses; the answer ``{"ok": true}``, or ``{"store": true}`` where a rank of
  the host that met on its own wrote the document first (each rank then sets its own key);
- ``segments``: no store request: once all are in, each gets every name
  (``{"names": {...}}``). A round short of its ranks at the deadline answers
  ``{"store": true}`` to all of them, and to any that comes later: the host's ranks then
  exchange through the store's keys, as a rank whose agent is gone does, so the two paths
  never wait on each other;
- ``mapped``: the gathered ranks are counted in at once (one add of their number) and
  the agent reads the verdict once for them (``{"verdict": ...}``).

A rank that comes after its round closed gets ``{"store": true}`` and meets on its own.
Where the agent's store requests fail, its ranks meet on their own (``{"store": true}``),
or, once the agent read no verdict for them, read it on their own (``{"counted": true}``).
A rank whose agent took its ``mapped`` frame and then failed it (or died) looks for its
agent's marker before it counts itself in (:func:`.meet_keys.counted`), so no rank is
counted twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from cclctl.ranges import parse_ranks
from cclctl.runtime.hostagent import meet_keys
from cclctl.runtime.hostagent.fanin import FanInStore, Where

log = logging.getLogger("cclctl.hostagent")

#: how long a round waits for the rest of its host's ranks after the first came
GATHER_S = 5.0
STORE: dict[str, Any] = {"store": True}


@dataclasses.dataclass
class _Round:
    expected: frozenset[int]
    size: int
    timeout_s: float
    key: str
    got: dict[int, tuple[str, asyncio.Future[dict[str, Any]]]] = dataclasses.field(
        default_factory=dict
    )
    closed: bool = False
    timer: asyncio.TimerHandle | None = None


class MeetingService:
    """One agent's rounds of the meeting (see the module)."""

    def __init__(self, store: FanInStore, where: Where) -> None:
        self.store, self.where = store, where
        self._rounds: dict[tuple[str, str], _Round] = {}
        self._tasks: set[asyncio.Future[None]] = set()

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        """A rank's frame in; its answer out, once its round is done."""
        step, rank, key = str(body["meet"]), int(body["rank"]), str(body["key"])
        size, timeout_s = int(body["world_size"]), float(body["timeout_s"])
        if step not in ("addr", "segments", "mapped"):
            raise ValueError(f"no meeting step {step!r}")
        found = self._rounds.get((step, key))
        if found is None:
            expected = frozenset(parse_ranks(str(body["local"]), size))
            found = self._rounds[(step, key)] = _Round(expected, size, timeout_s, key)
            wait_s = min(GATHER_S, timeout_s / 4)
            loop = asyncio.get_running_loop()
            found.timer = loop.call_later(wait_s, self._close, step, found)
        if found.closed or rank in found.got:
            return dict(STORE)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        found.got[rank] = (str(body.get("value", "")), future)
        if found.expected <= found.got.keys():
            self._close(step, found)
        return await future

    def _close(self, step: str, round_: _Round) -> None:
        if round_.closed:
            return
        round_.closed = True
        if round_.timer is not None:
            round_.timer.cancel()
        task = asyncio.ensure_future(self._finish(step, round_))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, step: str, round_: _Round) -> None:
        got = {r: value for r, (value, _) in round_.got.items()}
        complete = round_.expected <= got.keys()
        try:
            answer = await self._answer(step, round_, got, complete)
        except Exception as exc:  # the agent's trouble with the store: its ranks go alone
            log.warning("cclctl host agent: the transport meeting's %s failed: %s", step, exc)
            answer = dict(STORE)
        for _, future in round_.got.values():
            if not future.done():
                future.set_result(answer)

    async def _answer(
        self, step: str, round_: _Round, got: dict[int, str], complete: bool
    ) -> dict[str, Any]:
        if step == "segments":
            return {"names": got} if complete else dict(STORE)
        tag = meet_keys.host_tag(round_.key)
        if step == "addr":
            won = await meet_keys.publish_addresses(self.store, tag, got)
            return {"ok": True} if won else dict(STORE)
        ranks = sorted(got)
        await meet_keys.count_in(self.store, ranks, got, round_.size)
        try:
            verdict = await meet_keys.verdict(
                self.store, ranks, round_.size, round_.timeout_s, self.where
            )
        except Exception as exc:
            log.warning("cclctl host agent: the transport meeting's verdict failed: %s", exc)
            return {"counted": True}
        return {"verdict": verdict}
