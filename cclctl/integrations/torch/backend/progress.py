"""A process group's progress: its calls run on lanes, in issue order where order matters.

torch's API returns a ``Work`` at once (``async_op=True``) or waits on it at once; either way
the call runs off the caller's hands, so a group's calls keep the order every rank issued
them in (the runtime's seq), whoever waits on them. The calls run on lanes, one thread each:

- the **collective** lane runs every collective, one at a time, in issue order;
- a **point-to-point** lane per peer and direction (``("send", peer)``, ``("recv", peer)``)
  runs that pair's sends (or receives) in issue order, as the runtime's per-pair seq needs
  (the k-th send from a to b matches the k-th receive at b from a), beside the other lanes:
  a send that waits for its receiver never holds up a receive issued after it, so two ranks
  that each ``isend`` to the other before their ``irecv`` do not deadlock.

Collectives and point-to-point calls never overlap on the transport: a collective starts
once every point-to-point call issued before it ended, and a point-to-point call once the
collective issued before it ended (one order across kinds, as on NCCL's stream). A lane
thread completes each call's future: with its result, whose callbacks (DDP's hooks) then
run on that thread, or with the error the call raised.

A call that is first in its lane with nothing before it pending may run on the waiter's
own thread instead (:meth:`Progress.run_here`, what ``Work.wait()`` tries first): torch's
synchronous calls wait at once, so they skip the handoff to the lane's thread.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable

import torch

Result = list[torch.Tensor]
#: the lane every collective runs on
COLLECTIVE: Hashable = "collective"


class Entry:
    """One submitted call: its job, its future, the calls it runs after, and its state."""

    __slots__ = ("after", "done", "future", "job", "lane")

    def __init__(
        self,
        job: Callable[[], Result],
        lane: Hashable,
        after: list[Entry],
    ) -> None:
        self.job = job
        self.lane = lane
        self.after = after  # calls of other lanes that must end first
        self.future: torch.futures.Future[Result] = torch.futures.Future()
        self.done = False

    def ready(self) -> bool:
        """Whether every call it runs after has ended."""
        return all(e.done for e in self.after)

    def run(self) -> None:
        """Run the job and complete the future (its callbacks run here, on this thread)."""
        try:
            result = self.job()
        except BaseException as exc:  # the caller's wait() raises it
            self.future.set_exception(exc)  # type: ignore[arg-type]  # torch types it as T
        else:
            self.future.set_result(result)


class Progress:
    """The lanes of one group; their threads start on first use and end at :meth:`close`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()  # guards everything below
        self._queues: dict[Hashable, collections.deque[Entry]] = {}
        self._busy: set[Hashable] = set()  # lanes whose head call is running
        self._threads: dict[Hashable, threading.Thread] = {}
        self._last_collective: Entry | None = None
        self._p2p_since: list[Entry] = []  # point-to-point calls since that collective
        self._closed = False

    def submit(self, job: Callable[[], Result], lane: Hashable = COLLECTIVE) -> Entry:
        """Queue ``job`` on ``lane``; its future completes once it ran, after the calls
        before it in its lane and those of other kinds issued before it."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the cclctl process group was destroyed")
            if lane == COLLECTIVE:
                after = [e for e in self._p2p_since if not e.done]
                self._p2p_since = []
                entry = self._last_collective = Entry(job, lane, after)
            else:
                last = self._last_collective
                entry = Entry(job, lane, [] if last is None or last.done else [last])
                self._p2p_since.append(entry)
            queue = self._queues.get(lane)
            if queue is None:
                queue = self._queues[lane] = collections.deque()
                self._start(lane)
            queue.append(entry)
            self._cond.notify_all()
        return entry

    def run_here(self, entry: Entry) -> bool:
        """Run ``entry`` on this thread if it is first in its lane, nothing runs there and
        the calls it follows have ended; False (nothing done) otherwise."""
        with self._cond:
            queue = self._queues.get(entry.lane)
            if not queue or queue[0] is not entry or entry.lane in self._busy:
                return False
            if not entry.ready():
                return False
            queue.popleft()
            self._busy.add(entry.lane)
        self._finish(entry)
        return True

    def close(self) -> None:
        """Run what is queued, then end the lanes' threads (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = list(self._threads.values())
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def _start(self, lane: Hashable) -> None:
        name = self._name if lane == COLLECTIVE else f"{self._name} {lane}"
        thread = threading.Thread(target=self._run, args=(lane,), name=name, daemon=True)
        self._threads[lane] = thread
        thread.start()

    def _finish(self, entry: Entry) -> None:
        """Run ``entry`` (taken off its lane, which is marked busy), then free the lane."""
        try:
            entry.run()
        finally:
            with self._cond:
                entry.done = True
                self._busy.discard(entry.lane)
                self._cond.notify_all()

    def _next(self, lane: Hashable) -> Entry | None:
        """The lane's next call once it may run (None: closed and drained)."""
        queue = self._queues[lane]
        with self._cond:
            while True:
                if queue and lane not in self._busy and queue[0].ready():
                    self._busy.add(lane)
                    return queue.popleft()
                if self._closed and not queue and lane not in self._busy:
                    return None
                self._cond.wait()

    def _run(self, lane: Hashable) -> None:
        while (entry := self._next(lane)) is not None:
            self._finish(entry)
