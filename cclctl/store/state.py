"""The store's data and its operations, run only on the server's event loop.

Keeping every operation on one loop makes each one atomic without locks; a blocking
``get``/``wait`` parks one future on the keys it needs, never a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cclctl.store.protocol import Op, Status

Reply = tuple[Status, Sequence[bytes]]

BLOCKING_OPS = frozenset((Op.GET, Op.WAIT))


class StoreState:
    """Keys (bytes) to values (bytes), plus the futures of requests waiting for keys."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self._waiters: dict[bytes, set[asyncio.Future[bool]]] = {}

    def waiting(self, key: bytes) -> int:
        """How many requests wait for ``key`` now (what a blocked ``get`` or ``wait`` shows)."""
        return len(self._waiters.get(key, ()))

    def would_block(self, op: int, fields: Sequence[bytes]) -> bool:
        return op in BLOCKING_OPS and any(key not in self.data for key in fields)

    def apply(self, op: int, fields: Sequence[bytes]) -> Reply:
        """Run a request that needs no waiting (``would_block`` is False) to completion."""
        try:
            return self._apply(op, fields)
        except IndexError:
            raise ValueError(f"store request {op} has too few fields") from None

    def _apply(self, op: int, fields: Sequence[bytes]) -> Reply:
        data = self.data
        if op == Op.SET:
            self._put(fields[0], fields[1])
            return Status.OK, ()
        if op == Op.SET_MANY:  # one request: no reader sees some of its keys set and not all
            if not fields or len(fields) % 2:
                raise ValueError("a set of many keys needs key, value pairs")
            for i in range(0, len(fields), 2):
                self._put(fields[i], fields[i + 1])
            return Status.OK, ()
        if op in (Op.GET, Op.TRY_GET):
            value = data.get(fields[0])
            return (Status.NOT_FOUND, ()) if value is None else (Status.OK, (value,))
        if op == Op.WAIT:
            return Status.OK, ()
        if op == Op.ADD:
            return self._add(fields[0], fields[1])
        if op == Op.COMPARE_SET:
            return self._compare_set(fields[0], fields[1], fields[2] if len(fields) > 2 else None)
        if op == Op.LIST:
            prefix = fields[0]
            found = [part for k, v in data.items() if k.startswith(prefix) for part in (k, v)]
            return Status.OK, found
        if op == Op.DELETE:
            existed = data.pop(fields[0], None) is not None
            return (Status.OK if existed else Status.NOT_FOUND), ()
        if op == Op.PING:
            return Status.OK, ()
        raise ValueError(f"unknown store operation {op}")

    async def apply_blocking(self, op: int, fields: Sequence[bytes], timeout: float) -> Reply:
        """``get``/``wait``: wait for the keys, then answer (TIMEOUT names what is missing)."""
        if not fields:
            raise ValueError(f"store request {op} has too few fields")
        missing = await self._wait_for(fields, timeout)
        if missing:
            return Status.TIMEOUT, missing
        return self._apply(op, fields)

    def _add(self, key: bytes, delta_text: bytes) -> Reply:
        current = self.data.get(key, b"0")
        try:
            value = int(current) + int(delta_text)
        except ValueError:
            name = key.decode(errors="replace")
            shown = current[:40].decode(errors="replace")
            return Status.ERROR, (f"key {name!r} holds {shown!r}, not an integer".encode(),)
        encoded = str(value).encode()
        self._put(key, encoded)
        return Status.OK, (encoded,)

    def _compare_set(self, key: bytes, desired: bytes, expected: bytes | None) -> Reply:
        current = self.data.get(key)
        if current == expected:
            self._put(key, desired)
            return Status.OK, (desired,)
        return (Status.NOT_FOUND, ()) if current is None else (Status.OK, (current,))

    def _put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        for future in self._waiters.pop(key, ()):
            if not future.done():
                future.set_result(True)

    async def _wait_for(self, keys: Sequence[bytes], timeout: float) -> list[bytes]:
        """Wait until every key exists; return the keys still missing at the timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout < 0 else loop.time() + timeout
        while True:
            missing = [key for key in keys if key not in self.data]
            if not missing or (deadline is not None and loop.time() >= deadline):
                return missing
            future: asyncio.Future[bool] = loop.create_future()
            for key in missing:
                self._waiters.setdefault(key, set()).add(future)
            timer = None if deadline is None else loop.call_at(deadline, _resolve, future)
            try:
                await future
            finally:
                if timer is not None:
                    timer.cancel()
                self._forget(future, missing)

    def _forget(self, future: asyncio.Future[bool], keys: Sequence[bytes]) -> None:
        for key in keys:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiters[key]


def _resolve(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
