"""The host agent's one wait on the job's revoke record, handed on to the host's ranks.

Without an agent every rank holds a blocking ``wait`` on the job's ``revoke`` key
(:mod:`cclctl.revocation`): at 100,000 ranks, 100,000 watchers in one store. With one, the
agent holds the host's only wait (:class:`RevokeFanout`) and its ranks ask it instead, on a
socket of its own next to the status socket (:func:`fanout_name`), so the store has one
watcher per host. What a rank asks and gets (:data:`ASK`, :data:`ANSWER`): "the record,
once there is one" (``fresh``: re-read the store first, as a rank does after a retry or a
shrink cleared the record it had), answered by the record's bytes as the store holds them,
or by nothing at the end of a :data:`SLICE_S` slice, so a rank whose agent stalls finds out
and waits on the store itself (:mod:`.revoke_feed`, the rank's side).

While there is no record the agent's wait blocks in the store (a blocking ``get``: the
record comes with the wake-up); while there is one it reads the key again every
``poll_s`` (a withdrawn hang, a retry's cleared key, a newer record). A store that fails
:data:`GIVE_UP` times in a row ends the fan-out: it closes its ranks' connections and its
socket, and each rank waits on the store itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from cclctl import revocation
from cclctl.errors import StoreTimeout
from cclctl.runtime.hostagent.address import peer_uid
from cclctl.store.backends import open_store
from cclctl.store.scope import ScopedStore

log = logging.getLogger("cclctl.hostagent")

ASK = struct.Struct(">B")  # 1: re-read the store before answering (the rank renewed)
ANSWER = struct.Struct(">I")  # length of the record that follows (0: none within the slice)
#: the largest record handed on (a record is a few hundred bytes)
MAX_RECORD = 64 << 10
#: the longest a rank's ask waits for an answer (nothing) before it asks again
SLICE_S = 5.0
#: one blocking wait on the store, then the fan-out waits again
WATCH_SLICE_S = 30.0
#: store errors in a row after which the fan-out ends (its ranks wait themselves)
GIVE_UP = 5
STORE_OP_S = 2.0

#: ``wait(timeout_s)``: the key's bytes once it exists (a blocking ``get``), None at the timeout
Wait = Callable[[float], Awaitable[bytes | None]]
#: ``read()``: the key's bytes, None if it has none
Read = Callable[[], Awaitable[bytes | None]]


def fanout_name(agent_name: str) -> str:
    """The fan-out's abstract socket, next to the agent's (:func:`.address.socket_name`)."""
    return f"{agent_name}-revoke"


class RevokeFanout:
    """One host's wait on its job's revoke record (``wait``, ``read``), handed to its ranks
    (:meth:`serve`). An asyncio object with no process of its own, like
    :class:`~.server.HostAgent`, so a simulator runs thousands."""

    def __init__(self, wait: Wait, read: Read, *, poll_s: float, slice_s: float = SLICE_S):
        self.poll_s = poll_s
        self.slice_s = slice_s
        self.current: bytes | None = None  # the record as the agent saw it last
        self.failed = ""  # why the fan-out ended (empty while it serves)
        self.waits = 0  # blocking waits on the store
        self.reads = 0  # reads of the key
        self.answered = 0  # records handed to ranks
        self.subscribers = 0  # ranks' connections open now
        self._wait = wait
        self._read = read
        self._news = asyncio.Event()  # set (and replaced) whenever ``current`` changes
        self._reading = asyncio.Lock()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None

    # ------------------------------------------------------------------ the store's side
    async def refresh(self) -> bytes | None:
        """Read the key now; the record as it is."""
        async with self._reading:
            self.reads += 1
            self._set(await self._read())
        return self.current

    def _set(self, raw: bytes | None) -> None:
        if raw != self.current:
            self.current = raw
            self._wake()

    def _wake(self) -> None:
        news, self._news = self._news, asyncio.Event()
        news.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Wait on the key (a blocking wait while there is no record, a read every
        ``poll_s`` while there is one) until ``stop``, or until the store failed
        :data:`GIVE_UP` times in a row."""
        errors = 0
        while not stop.is_set():
            try:
                if self.current is None:
                    self.waits += 1
                    raw = await self._wait(WATCH_SLICE_S)
                    if raw is not None:
                        async with self._reading:
                            self._set(raw)
                    continue
                await _first_of(stop.wait(), self._news.wait(), timeout_s=self.poll_s)
                if stop.is_set():
                    break
                await self.refresh()
                errors = 0
            except Exception as exc:  # the store's trouble: tried again, then given up
                if stop.is_set():
                    break
                errors += 1
                if errors >= GIVE_UP:
                    self.fail(f"{type(exc).__name__}: {exc}")
                    return
                await _first_of(stop.wait(), timeout_s=0.2 * errors)

    def fail(self, why: str) -> None:
        """End the fan-out for the store's trouble (logged): see :meth:`close`."""
        log.warning("cclctl host agent: the revoke record's fan-out ended: %s", why)
        self.close(why)

    def close(self, why: str = "the agent is ending") -> None:
        """End the fan-out: every rank's connection closes, so each waits on the store."""
        self.failed = self.failed or why
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        self._wake()

    # ------------------------------------------------------------------ the ranks' side
    async def serve(self, name: str) -> asyncio.AbstractServer:
        """Listen on the abstract socket ``name`` (:func:`fanout_name`)."""
        self._server = await asyncio.start_unix_server(self._connection, path=name)
        return self._server

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if self.failed or sock is None or peer_uid(sock) != os.getuid():
            writer.close()
            return
        self.subscribers += 1
        self._writers.add(writer)
        try:
            while not self.failed:
                (fresh,) = ASK.unpack(await reader.readexactly(ASK.size))
                raw = await self.next_record(bool(fresh))
                if self.failed:
                    break
                writer.write(ANSWER.pack(len(raw or b"")) + (raw or b""))
                await writer.drain()
                self.answered += bool(raw)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # the agent's loop is ending (asyncio 3.11 would log a cancelled handler)
        finally:
            self.subscribers -= 1
            self._writers.discard(writer)
            writer.close()

    async def next_record(self, fresh: bool) -> bytes | None:
        """The record, once there is one (None: none within the slice); ``fresh``: read
        the store first (the rank's last record may be gone, as a store's wait would see)."""
        if fresh:
            with contextlib.suppress(Exception):  # the watch will say if the store is gone
                await self.refresh()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.slice_s
        while self.current is None and not self.failed:
            left = deadline - loop.time()
            if left <= 0:
                return None
            await _first_of(self._news.wait(), timeout_s=left)
        return self.current


async def _first_of(*waits: Awaitable[Any], timeout_s: float) -> None:
    """Return once one of ``waits`` is done or ``timeout_s`` passed; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when="FIRST_COMPLETED")
    finally:
        for task in tasks:
            task.cancel()


async def serve_fanout(spec: dict[str, Any], agent_name: str, stop: asyncio.Event) -> None:
    """The agent process's fan-out for the job of ``spec`` (:func:`.main.read_spec`): a
    store connection for the one blocking wait and one for reads (a client answers one
    request at a time, and a rank's read must not queue behind the wait), closed at
    ``stop``, which ends it."""
    token = spec["token"] or None
    waiting = open_store(spec["store"], timeout_s=WATCH_SLICE_S + STORE_OP_S,
                         connect_timeout_s=STORE_OP_S, token=token)  # fmt: skip
    reading = open_store(spec["store"], timeout_s=STORE_OP_S, connect_timeout_s=STORE_OP_S,
                         token=token)  # fmt: skip
    waits, reads = (ScopedStore.for_job(c, spec["job"]) for c in (waiting, reading))

    async def wait(timeout_s: float) -> bytes | None:
        try:
            return await asyncio.to_thread(waits.get, revocation.KEY, timeout_s)
        except StoreTimeout:
            return None

    async def read() -> bytes | None:
        return await asyncio.to_thread(reads.try_get, revocation.KEY)

    fanout = RevokeFanout(wait, read, poll_s=max(0.1, float(spec["interval_s"]) / 2))
    with contextlib.suppress(Exception):  # (the watch says if the store is gone)
        await fanout.refresh()  # the record as it is; and the store sees no rank's connection
    try:
        await fanout.serve(fanout_name(agent_name))
        watching = asyncio.ensure_future(fanout.run(stop))
        await stop.wait()
    except OSError as exc:
        log.warning("cclctl host agent: no revoke fan-out (%s); each rank waits itself", exc)
        watching = None
    fanout.close()
    waiting.close()  # ends a blocking wait at once
    reading.close()
    if watching is not None:
        with contextlib.suppress(Exception):
            await watching
