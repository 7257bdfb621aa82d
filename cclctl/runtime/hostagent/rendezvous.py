"""The host agent's rendezvous service: its ranks' claims in, one group to the store, each
rank's answer out (the job's world document, or the error that ended the rendezvous).

A rank connects to the agent's second socket (:func:`.address.rendezvous_name`), sends its
claim as one frame (:func:`frame`: a length, then JSON: rank, pid, world size, local world
size, timeout, and for the transport's choice its host key and whether it asked for TCP)
and reads one answer frame. After the rendezvous the same socket serves the rank's
transport meeting, a frame per step (:class:`~.meeting_service.MeetingService`: a frame
with ``meet``). The service gathers claims into a batch and
hands the batch to the fan-in protocol (:func:`cclctl.runtime.hostagent.fanin.join_group`) once
the host's ranks are all in (the largest local world size the claims carry), or
:data:`FLUSH_S` after the last claim came (at most :data:`MAX_BATCH_S` after the first: a
rank late to start, or a launcher that sets no local world size, costs one more group,
never a long wait); a second claim of a rank already in
the batch starts the next one, so the store sees both and names them. Before its first
group the agent checks its token against rank 0's proof once (one read), and every
answer says whether it matched; a rank whose answer says no checks its own, as a rank
alone does. An agent whose store requests fail (its store gone: a rerun's ranks may find
an earlier run's agent still lingering) answers so, and its ranks join alone.
:meth:`RendezvousService.claim` is the entry point the socket handler calls,
and the scale simulator calls it for its simulated ranks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from cclctl import auth
from cclctl.runtime.hostagent.address import peer_uid, rendezvous_name
from cclctl.runtime.hostagent.fanin import Claim, FanInStore, Where, join_group
from cclctl.runtime.hostagent.fanin_stores import ThreadedStore
from cclctl.runtime.hostagent.meeting_service import MeetingService
from cclctl.store.backends import open_store
from cclctl.store.kv import KeyValueStore
from cclctl.store.scope import ScopedStore

log = logging.getLogger("cclctl.hostagent")

#: a batch short of the host's ranks goes this long after its last claim, and no later
#: than :data:`MAX_BATCH_S` after its first
FLUSH_S = 1.0
MAX_BATCH_S = 5.0
LENGTH = struct.Struct(">I")
#: the largest claim the agent reads; the largest answer a rank reads (a world document)
MAX_CLAIM = 4 << 10
MAX_ANSWER = 64 << 20
#: the store's answer to one request of the agent's (a blocking read waits its own timeout)
WRITE_TIMEOUT_S = 10.0


def frame(doc: dict[str, Any]) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    return LENGTH.pack(len(body)) + body


class RendezvousService:
    """One host's rendezvous: claims in (:meth:`claim`, :meth:`serve`), groups out."""

    def __init__(
        self,
        host: str,
        store: FanInStore,
        where: Where,
        check_token: Callable[[float], Awaitable[bool]] | None = None,
        hold: Callable[[int], None] = lambda delta: None,
    ) -> None:
        self.host = host
        self.store = store
        self.where = where
        self._check_token = check_token
        self._token_ok: asyncio.Task[bool] | None = None
        self._hold = hold  # +1 / -1 as a rank's connection opens and closes: the agent stays
        self._batch: list[tuple[Claim, int, asyncio.Future[dict[str, Any]]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._oldest = 0.0  # when the batch's first claim came (the loop's clock)
        self.groups = 0  # batches written as groups
        self._joining: set[asyncio.Future[None]] = set()  # the batches' tasks, kept
        self.meeting = MeetingService(store, where)  # then its ranks' transport meeting

    async def claim(self, body: dict[str, Any]) -> dict[str, Any]:
        """A rank's claim (``rank``, ``pid``, ``world_size``, ``local_world_size``,
        ``timeout_s``, and optionally ``key`` and ``tcp``) in; its answer out, once the
        job's world document is in."""
        claim = Claim(int(body["rank"]), int(body["pid"]), int(body["world_size"]),
                      float(body["timeout_s"]), str(body.get("key", "")),
                      body.get("tcp") is True)  # fmt: skip
        if any(c.rank == claim.rank for c, _, _ in self._batch):
            self._flush()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._batch.append((claim, max(1, int(body.get("local_world_size", 1))), future))
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        if len(self._batch) == 1:
            self._oldest = loop.time()
        if len(self._batch) >= max(expected for _, expected, _ in self._batch):
            self._flush()
        else:
            due = min(FLUSH_S, self._oldest + MAX_BATCH_S - loop.time())
            self._timer = loop.call_later(max(0.0, due), self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch = self._batch, []
        if batch:
            self.groups += 1
            task = asyncio.ensure_future(self._join(batch))
            self._joining.add(task)
            task.add_done_callback(self._joining.discard)

    async def _join(self, batch: list[tuple[Claim, int, asyncio.Future[dict[str, Any]]]]) -> None:
        claims = sorted((c for c, _, _ in batch), key=lambda c: c.rank)
        try:
            token_ok = await self._token(min(c.timeout_s for c in claims))
            answers = await join_group(self.store, self.host, claims, self.where)
        except Exception as exc:  # the agent's trouble with the store: its ranks join alone
            log.warning("cclctl host agent: the rendezvous of %s failed: %s", self.host, exc)
            failed = f"{type(exc).__name__}: {exc}"
            token_ok, answers = False, {c.rank: {"agent_failed": failed} for c in claims}
        for claim, _, future in batch:
            if not future.done():
                future.set_result(dict(answers[claim.rank], token_ok=token_ok))

    async def _token(self, timeout_s: float) -> bool:
        """Whether the agent's token is rank 0's (checked once, by the first group)."""
        if self._check_token is None:
            return False
        if self._token_ok is None:
            self._token_ok = asyncio.ensure_future(self._check_token(timeout_s))
        return await self._token_ok

    async def serve(self, name: str) -> asyncio.AbstractServer:
        """Listen on the abstract socket ``name`` (:func:`.address.rendezvous_name`)."""
        return await asyncio.start_unix_server(self._connection, path=name)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is None or peer_uid(sock) != os.getuid():
            writer.close()
            return
        self._hold(1)
        try:
            (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
            if length > MAX_CLAIM:
                return
            body = json.loads(await reader.readexactly(length))
            meets = isinstance(body, dict) and "meet" in body
            writer.write(frame(await (self.meeting.handle(body) if meets else self.claim(body))))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError, TypeError):
            pass  # a rank gone or garbage: that rank's own trouble
        finally:
            self._hold(-1)
            writer.close()


async def serve_rendezvous(
    spec: dict[str, Any], name: str, hold: Callable[[int], None]
) -> Callable[[], None]:
    """The agent process's service, listening beside the status socket ``name``, on two
    connections of its own to the job's store (its blocking reads hold one), opened at the
    first claim; returns what closes them."""
    token = spec["token"]
    clients: list[KeyValueStore] = []

    def opened() -> ScopedStore:  # at the first claim's first request, on a worker thread
        client = open_store(spec["store"], timeout_s=WRITE_TIMEOUT_S,
                            connect_timeout_s=WRITE_TIMEOUT_S, token=token or None)  # fmt: skip
        clients.append(client)
        return ScopedStore.for_job(client, spec["job"])

    store = ThreadedStore(opened, opened)

    async def check_token(timeout_s: float) -> bool:
        check = await store.get(auth.TOKEN_CHECK_KEY, timeout_s)
        return bool(token) and check is not None and auth.proves_check(check, token, spec["job"])

    where = Where(spec["job"], spec["store"])
    service = RendezvousService(spec["host"], store, where, check_token, hold)
    server = await service.serve(rendezvous_name(name))

    def close_all() -> None:
        server.close()
        for client in clients:
            client.close()

    return close_all
