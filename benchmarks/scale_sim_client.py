"""An asyncio client of the store's protocol for ``scale_sim.py``: one TCP connection,
requests pipelined.

The store answers a connection's requests in order (:mod:`cclctl.store.connection`), so a
client may send many before the first answer: each request queues a future, one reader
task resolves them in order. ``max_pending`` bounds the requests in flight. With a token it
makes the store's handshake (:mod:`cclctl.store.access`) as the blocking client does, the
store proving itself first.
"""

from __future__ import annotations

import asyncio
import collections

from cclctl import auth
from cclctl.store import access
from cclctl.store.protocol import (
    REPLY_HEADER,
    Op,
    Status,
    field_lengths,
    pack_request,
    split_fields,
)


class AsyncStore:
    """One connection to the store; :meth:`set` and :meth:`delete` may be awaited by many
    tasks at once."""

    def __init__(self, max_pending: int = 256) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: collections.deque[asyncio.Future[tuple[int, list[bytes]]]] = (
            collections.deque()
        )
        self._slots = asyncio.Semaphore(max_pending)
        self._task: asyncio.Task[None] | None = None
        self.requests = 0
        self.sent_bytes = 0

    async def connect(self, host: str, port: int, token: str | None) -> AsyncStore:
        self._reader, self._writer = await asyncio.open_connection(host, port, limit=1 << 20)
        self._task = asyncio.ensure_future(self._read_replies())
        if token:
            nonce = auth.nonce()
            status, hello = await self.request(Op.HELLO, [nonce])
            if status != Status.OK or not auth.verify(
                token, hello[1], access.SERVER_ROLE, nonce, hello[0]
            ):
                raise ConnectionError("the store did not prove the token")
            status, _ = await self.request(Op.AUTH, [access.client_proof(token, hello[0], nonce)])
            if status != Status.OK:
                raise ConnectionError("the store refused the token")
        return self

    async def request(
        self, op: Op, fields: list[bytes], timeout_s: float | None = None
    ) -> tuple[int, list[bytes]]:
        assert self._writer is not None, "connect() first"
        async with self._slots:
            future: asyncio.Future[tuple[int, list[bytes]]] = (
                asyncio.get_running_loop().create_future()
            )
            self._pending.append(future)
            frame = pack_request(op, fields, timeout_s)
            self._writer.write(frame)
            self.requests += 1
            self.sent_bytes += len(frame)
            await self._writer.drain()
            return await future

    async def set(self, key: str, value: bytes) -> None:
        status, fields = await self.request(Op.SET, [key.encode(), value])
        if status != Status.OK:
            raise ConnectionError(f"set {key!r}: {fields[0].decode(errors='replace')}")

    async def set_many(self, items: dict[str, bytes]) -> None:
        """Every key in one request (a host agent's document and its head)."""
        fields = [part for key, value in items.items() for part in (key.encode(), value)]
        status, out = await self.request(Op.SET_MANY, fields)
        if status != Status.OK:
            raise ConnectionError(f"set {list(items)!r}: {out[0].decode(errors='replace')}")

    async def delete(self, key: str) -> None:
        await self.request(Op.DELETE, [key.encode()])

    async def _read_replies(self) -> None:
        assert self._reader is not None
        try:
            while True:
                status, count = REPLY_HEADER.unpack(
                    await self._reader.readexactly(REPLY_HEADER.size)
                )
                lengths = field_lengths(await self._reader.readexactly(4 * count), count)
                payload = await self._reader.readexactly(sum(lengths))
                self._pending.popleft().set_result((status, split_fields(payload, lengths)))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            while self._pending:
                self._pending.popleft().set_exception(ConnectionError(f"store lost: {exc}"))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._task is not None:
            self._task.cancel()
