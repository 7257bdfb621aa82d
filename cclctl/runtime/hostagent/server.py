"""The host agent's core: it takes its ranks' statuses and writes one document per interval.

:class:`HostAgent` is an asyncio object with no process of its own, so one process can run
thousands of them (the scale simulator in ``benchmarks/``) and the agent process
(:mod:`.main`) runs one. Its ``write`` coroutine stores a host document (the process: one
``set`` of ``host/<hostname>`` on the job's store); a write that fails is counted and the
next interval tries again with the newer statuses, never raised into a rank.

Writes happen once per status interval, and sooner (coalesced, at most one per
:data:`SOON_S`) when a rank is new, when its connection ends or when its status newly
carries an end or a failure (``finished``, ``ending``, ``revoke``): what a reader must see
at once.

Each document also says which of its ranks' processes are stopped or gone, as the agent
finds them by the pid at the other end of each rank's connection (``look``): the agent is
on their host, where a reader elsewhere sees only statuses that age.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cclctl import limits
from cclctl.host_status import PROC_GONE, HostDocument, summarize
from cclctl.runtime.hostagent.address import peer_pid, peer_uid
from cclctl.runtime.hostagent.wire import HEADER, MAX_STATUS, news_frame
from cclctl.runtime.peer_process import looked_at

log = logging.getLogger("cclctl.hostagent")

#: a write that should not wait for the interval waits this long for others to join it
SOON_S = 0.05
#: writes failed in a row after which the agent ends (its store is gone, or another run's
#: took its port): its ranks then publish their own statuses
GIVE_UP_WRITES = 5
_URGENT = ("finished", "ending", "revoke")


class HostAgent:
    """One host's agent: statuses in (:meth:`serve` or :meth:`receive`), documents out."""

    def __init__(
        self,
        host: str,
        write: Callable[[HostDocument], Awaitable[None]],
        interval_s: float,
        *,
        pid: int | None = None,
        clock: Callable[[], int] = time.time_ns,
        look: Callable[[int], str | None] = looked_at,
    ) -> None:
        self.host = host
        self.interval_s = interval_s
        self.pid = os.getpid() if pid is None else pid
        self.statuses: dict[int, str] = {}  # as the ranks sent them
        self._parsed: dict[int, Any] = {}  # the same, decoded: for the summary
        self.left: dict[int, str] = {}
        #: each rank's process, as its connection's peer: what ``look`` is asked of
        self.pids: dict[int, int] = {}
        #: ranks whose process was seen gone: so it stays, should the pid be reused
        self._gone: dict[int, int] = {}
        #: what every status is answered with: the job's requests for the host's ranks
        #: (:meth:`set_news`; the process reads them from the store once per interval)
        self.news: dict[str, Any] = {}
        #: the ranks whose status the last document written holds (a rank's answer says
        #: so: until then, the status it wrote to its own key is the only one readers see)
        self.written: set[int] = set()
        self.connected = 0  # ranks' connections open now
        self.held = 0  # ranks' rendezvous connections open now (:meth:`hold`)
        self.ever_connected = 0
        self.refused = 0  # connections of another user
        self.writes = 0
        self.write_errors = 0
        self.failed_in_a_row = 0
        self.last_error = ""
        self._write = write
        self._clock = clock
        self._look = look
        self._soon = asyncio.Event()
        self._changed = asyncio.Event()  # a connection opened or closed

    # ------------------------------------------------------------------ statuses in
    def receive(self, rank: int, body: bytes) -> None:
        """Keep ``body`` as rank ``rank``'s newest status (one that is not JSON is kept as
        it is: the reader reports it as that rank's bad status)."""
        text = body.decode("utf-8", errors="replace")
        try:
            doc: Any = json.loads(text)
        except (ValueError, RecursionError):
            doc = None
        known = rank in self.statuses
        before = self._parsed.get(rank)
        self.statuses[rank] = text
        self._parsed[rank] = doc
        self.left.pop(rank, None)
        self._gone.pop(rank, None)  # a rank that speaks is no dead process's
        was = before if isinstance(before, dict) else {}
        news = isinstance(doc, dict) and any(doc.get(k) and not was.get(k) for k in _URGENT)
        if news or not known:
            self._soon.set()

    async def serve(self, name: str) -> asyncio.AbstractServer:
        """Listen on the abstract socket ``name`` (:func:`.address.socket_name`)."""
        return await asyncio.start_unix_server(self._connection, path=name)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is None or peer_uid(sock) != os.getuid():
            self.refused += 1
            writer.close()
            return
        self.connected += 1
        self.ever_connected += 1
        self._changed.set()
        ranks: set[int] = set()
        pid = peer_pid(sock)
        why = "its connection to the host agent closed"
        try:
            while True:
                rank, length = HEADER.unpack(await reader.readexactly(HEADER.size))
                if length > MAX_STATUS:
                    why = f"it sent a status of {length:,} bytes, over the agent's limit"
                    break
                if rank >= limits.MAX_WORLD_SIZE:  # readers would refuse the whole document
                    why = f"it sent a status as rank {rank:,}, beyond any job's"
                    break
                self.receive(rank, await reader.readexactly(length))
                ranks.add(rank)
                self.pids[rank] = pid
                writer.write(news_frame(self.answer(rank)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.connected -= 1
            self._changed.set()
            writer.close()
            now = time.strftime("%H:%M:%S", time.gmtime(self._clock() / 1e9))
            for rank in ranks:
                self.left[rank] = f"{why} at {now} UTC"
            self._soon.set()

    def answer(self, rank: int) -> bytes:
        """What a status of ``rank`` is answered with: the news, and whether the last
        document written holds the rank's status."""
        return json.dumps({**self.news, "written": rank in self.written}).encode()

    def decoded(self) -> dict[int, Any]:
        """Each rank's newest status, decoded (None where it is not JSON): the exporter's."""
        return dict(self._parsed)

    def counts(self) -> dict[str, int]:
        """The agent's own counts, for its exporter."""
        return {"writes": self.writes, "write_errors": self.write_errors,
                "refused": self.refused, "connected": self.connected}  # fmt: skip

    def hold(self, delta: int) -> None:
        """A rank's rendezvous connection opened (+1) or closed (-1): while one is open the
        agent stays, and it waits ``first_s`` for statuses again after (:meth:`idle_for`)."""
        self.held += delta
        self._changed.set()

    def processes(self) -> dict[int, tuple[int, str]]:
        """The ranks whose process is not running now (rank -> (pid, state)): each looked
        at by its connection's pid; one seen gone stays gone until its rank speaks again."""
        found: dict[int, tuple[int, str]] = {}
        for rank, pid in self.pids.items():
            state = PROC_GONE if self._gone.get(rank) == pid else self._look(pid)
            if state == PROC_GONE:
                self._gone[rank] = pid
            if state is not None:
                found[rank] = (pid, state)
        return found

    # ------------------------------------------------------------------ documents out
    def document(self) -> HostDocument:
        return HostDocument(
            host=self.host,
            pid=self.pid,
            time_ns=self._clock(),
            interval_s=self.interval_s,
            statuses=dict(self.statuses),
            left=dict(self.left),
            summary=summarize(self._parsed, self.statuses),
            procs=self.processes(),
        )

    async def flush(self) -> bool:
        """Write the document now (nothing before the first status); False if it failed."""
        if not self.statuses:
            return True
        doc = self.document()
        try:
            await self._write(doc)
        except Exception as exc:  # the store's trouble: counted, tried again next time
            self.write_errors += 1
            self.failed_in_a_row += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("cclctl host agent: writing %s's statuses failed: %s", self.host, exc)
            return False
        self.writes += 1
        self.failed_in_a_row = 0
        self.written = set(doc.statuses)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Write every interval (and soon after an urgent change) until ``stop``, then once
        more, so the last statuses reach the store; or until :data:`GIVE_UP_WRITES` writes
        failed in a row."""
        while not stop.is_set():
            if self.failed_in_a_row >= GIVE_UP_WRITES:
                log.warning("cclctl host agent of %s: %d writes failed in a row, ending",
                            self.host, self.failed_in_a_row)  # fmt: skip
                return
            soon = asyncio.ensure_future(self._soon.wait())
            ended = asyncio.ensure_future(stop.wait())
            await asyncio.wait(
                {soon, ended}, timeout=self.interval_s, return_when="FIRST_COMPLETED"
            )
            for task in (soon, ended):
                task.cancel()
            if self._soon.is_set() and not stop.is_set():
                await asyncio.sleep(SOON_S)  # let the host's other ranks' news join it
            self._soon.clear()
            await self.flush()
        await self.flush()

    async def idle_for(self, linger_s: float, first_s: float) -> None:
        """Return once no rank has been connected for ``linger_s`` (after one came), or none
        came within ``first_s``: the agent process's cue to end."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        while True:
            timeout: float | None = None  # ranks connected: until one leaves
            if not self.connected and not self.held:
                timeout = (linger_s if self.ever_connected else first_s) - (loop.time() - since)
                if timeout <= 0:
                    return
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                continue
            if not self.connected and not self.held:
                since = loop.time()
