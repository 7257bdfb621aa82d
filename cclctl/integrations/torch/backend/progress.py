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
collective issued before it ended (one order across kinds, as on NCCL's stream). A call's
outcome (its output tensors, or the error it raised) is kept on its :class:`Entry`; its
future, where torch asks for one (DDP's hooks chain on it), is completed by whichever
thread ran the call, and its callbacks run there.

A call may run on the caller's thread instead, in the same order: one torch waits on at
once (``async_op=False``: ``submit(now=True)``) when nothing is before it, and any call
that is first in its lane with nothing before it pending when ``Work.wait()`` asks
(:meth:`Progress.run_here`). That skips the handoff, and waking a lane's thread costs
about as much CPU as a small call itself.
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
    """One submitted call: its job, the calls it runs after, and once it ran, its outcome.

    Its ``torch.futures.Future`` is made only when asked for (:meth:`Progress.future`):
    torch's synchronous calls never ask, so they make none."""

    __slots__ = ("_future", "after", "done", "error", "job", "lane", "ran", "result", "waiters")

    def __init__(self, job: Callable[[], Result], lane: Hashable, after: list[Entry]) -> None:
        self.job = job
        self.lane = lane
        self.after = after  # calls of other lanes that must end first
        self.ran = False  # the outcome is known (the future, if any, is being completed)
        self.done = False  # ... and its future completed: the lane moves on
        self.result: Result = []
        self.error: BaseException | None = None
        self.waiters = 0  # threads blocked in Progress.wait on it
        self._future: torch.futures.Future[Result] | None = None

    def ready(self) -> bool:
        """Whether every call it runs after has ended."""
        return all(e.done for e in self.after)

    def _completed_future(self) -> torch.futures.Future[Result]:
        future: torch.futures.Future[Result] = torch.futures.Future()
        if self.error is not None:
            future.set_exception(self.error)  # type: ignore[arg-type]  # torch types it as T
        else:
            future.set_result(self.result)
        return future


class Progress:
    """The lanes of one group; their threads start on first use and end at :meth:`close`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()  # guards everything below and every entry's state
        self._ended = threading.Condition(self._lock)  # a call that someone waits on ended
        self._conds: dict[Hashable, threading.Condition] = {}  # each lane's thread waits here
        self._queues: dict[Hashable, collections.deque[Entry]] = {}
        self._busy: set[Hashable] = set()  # lanes whose head call is running
        self._threads: dict[Hashable, threading.Thread] = {}
        self._last_collective: Entry | None = None
        self._p2p_since: list[Entry] = []  # point-to-point calls since that collective
        self._closed = False

    def submit(
        self, job: Callable[[], Result], lane: Hashable = COLLECTIVE, *, now: bool = False
    ) -> Entry:
        """Queue ``job`` on ``lane``; it runs after the calls before it in its lane and
        those of the other kind issued before it. ``now`` (torch's ``async_op=False``: the
        caller waits at once): run it on this thread before returning where it may start
        now, without waking the lane's thread."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the cclctl process group was destroyed")
            entry = self._enter(job, lane)
            queue = self._queues.get(lane)
            if queue is None:
                queue = self._queues[lane] = collections.deque()
                self._start(lane)
            inline = (
                now and not queue and lane not in self._busy and (not entry.after or entry.ready())
            )
            if inline:
                self._busy.add(lane)
                entry.after = []
            else:
                queue.append(entry)
                if lane not in self._busy:
                    self._conds[lane].notify()
        if inline:
            self._finish(entry)
        return entry

    def _enter(self, job: Callable[[], Result], lane: Hashable) -> Entry:
        """The call's entry, after the other kind's calls issued before it (under the lock)."""
        if lane == COLLECTIVE:
            after = [e for e in self._p2p_since if not e.done] if self._p2p_since else []
            self._p2p_since = []
            entry = self._last_collective = Entry(job, lane, after)
        else:
            last = self._last_collective
            entry = Entry(job, lane, [] if last is None or last.done else [last])
            if len(self._p2p_since) >= 64:  # a job of point-to-point calls only: keep it short
                self._p2p_since = [e for e in self._p2p_since if not e.done]
            self._p2p_since.append(entry)
        return entry

    def run_here(self, entry: Entry) -> bool:
        """Run ``entry`` on this thread if it is first in its lane, nothing runs there and
        the calls it follows have ended; False (nothing done) otherwise."""
        with self._lock:
            queue = self._queues.get(entry.lane)
            if not queue or queue[0] is not entry or entry.lane in self._busy:
                return False
            if not entry.ready():
                return False
            self._take(entry.lane)
        self._finish(entry)
        return True

    def wait(self, entry: Entry) -> Result:
        """Its result once it ran (here, if it may run now), or raise its error."""
        if not entry.done and not self.run_here(entry):
            with self._lock:
                entry.waiters += 1
                while not entry.done:
                    self._ended.wait()
                entry.waiters -= 1
        if entry.error is not None:
            raise entry.error
        return entry.result

    def future(self, entry: Entry) -> torch.futures.Future[Result]:
        """The call's future: its output tensors, or its error (made on first request)."""
        with self._lock:
            if entry._future is None:
                pending = not entry.ran
                entry._future = torch.futures.Future() if pending else entry._completed_future()
            return entry._future

    def close(self) -> None:
        """Run what is queued, then end the lanes' threads (idempotent)."""
        with self._lock:
            self._closed = True
            for cond in self._conds.values():
                cond.notify()
            threads = list(self._threads.values())
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def _start(self, lane: Hashable) -> None:
        name = self._name if lane == COLLECTIVE else f"{self._name} {lane}"
        self._conds[lane] = threading.Condition(self._lock)
        thread = threading.Thread(target=self._run, args=(lane,), name=name, daemon=True)
        self._threads[lane] = thread
        thread.start()

    def _take(self, lane: Hashable) -> Entry:
        """The lane's head call, taken to run (under the lock; the lane is then busy)."""
        self._busy.add(lane)
        entry = self._queues[lane].popleft()
        entry.after = []  # ended: no longer kept alive through it
        return entry

    def _finish(self, entry: Entry) -> None:
        """Run ``entry`` (taken off its lane, which is marked busy), complete its future if
        one was asked for (its callbacks run here), then free the lane."""
        try:
            entry.result = entry.job()
        except BaseException as exc:  # the waiter's wait() raises it
            entry.error = exc
        with self._lock:
            entry.ran = True
            future = entry._future
            if future is None:  # nobody asked for one (a synchronous call): free the lane
                self._ended_here(entry)
                return
        try:
            if future is not None and entry.error is not None:
                future.set_exception(entry.error)  # type: ignore[arg-type]  # torch: T
            elif future is not None:
                future.set_result(entry.result)
        finally:
            with self._lock:
                self._ended_here(entry)

    def _ended_here(self, entry: Entry) -> None:
        """``entry`` ended (its future, if any, completed): free its lane (under the lock)."""
        entry.done = True
        self._busy.discard(entry.lane)
        self._wake_after(entry)

    def _wake_after(self, entry: Entry) -> None:
        """Wake whoever may go on now that ``entry`` ended (under the lock): its waiters,
        its lane, and the lanes whose next call waits for another lane's."""
        if entry.waiters:
            self._ended.notify_all()
        if self._last_collective is entry:  # ended: nothing later waits for it
            self._last_collective = None
        for lane, queue in self._queues.items():
            if queue and (lane == entry.lane or queue[0].after):
                self._conds[lane].notify()
        if self._closed:  # its lane's thread may be waiting to end
            self._conds[entry.lane].notify()

    def _next(self, lane: Hashable) -> Entry | None:
        """The lane's next call once it may run (None: closed and drained)."""
        queue, cond = self._queues[lane], self._conds[lane]
        with self._lock:
            while True:
                if queue and lane not in self._busy and queue[0].ready():
                    return self._take(lane)
                if self._closed and not queue and lane not in self._busy:
                    return None
                cond.wait()

    def _run(self, lane: Hashable) -> None:
        while (entry := self._next(lane)) is not None:
            self._finish(entry)
