"""The store's server: one asyncio loop in one daemon thread serves every client.

Each connection is a bare :class:`asyncio.Protocol` (no streams, no task per request): a
request that can be answered now is answered inside ``data_received``, so a round trip costs
one loop wake-up. Only a ``get``/``wait`` on a missing key becomes a task, and it parks on a
future, so ten thousand connected ranks, most of them waiting, cost no threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading

from cclctl.errors import StoreError
from cclctl.store.protocol import Status, pack_reply, take_request
from cclctl.store.state import StoreState

LISTEN_BACKLOG = 4096  # ranks connect in a burst at start-up; the kernel caps it at somaxconn


class StoreServer:
    """A key-value store on ``host:port``, served from a background thread until closed."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._state = StoreState()
        self._connections: set[_Connection] = set()

    def start(self) -> StoreServer:
        """Bind now (so a taken port fails here, naming it) and serve in a daemon thread."""
        if self._thread is not None:
            return self
        try:
            self._sock = socket.create_server((self.host, self._port), backlog=LISTEN_BACKLOG)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise StoreError(
                f"cannot start the store on {self.host}:{self._port}: {reason}",
                address=f"{self.host}:{self._port}",
            ) from None
        self._port = int(self._sock.getsockname()[1])
        ready = threading.Event()
        self._thread = threading.Thread(
            target=asyncio.run,
            args=(self._serve(ready),),
            name=f"cclctl-store-{self._port}",
            daemon=True,
        )
        self._thread.start()
        ready.wait()
        return self

    @property
    def port(self) -> int:
        """The bound port (the one the OS picked when constructed with port 0)."""
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self._port}"

    def close(self) -> None:
        """Stop serving and drop every connection; clients then see a lost connection."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._loop = self._stop = None

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        assert self._sock is not None  # bound by start()
        server = await loop.create_server(
            lambda: _Connection(self._state, self._connections),
            sock=self._sock,
            backlog=LISTEN_BACKLOG,
        )
        ready.set()
        await self._stop.wait()
        server.close()
        for connection in list(self._connections):
            connection.close()
        # asyncio.run then cancels the waits that remain.


class _Connection(asyncio.Protocol):
    """One client. Requests are answered in order; a blocking one holds back the rest."""

    def __init__(self, state: StoreState, registry: set[_Connection]) -> None:
        self._state = state
        self._registry = registry
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._waiting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        if self._waiting is not None:
            self._waiting.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._waiting is None:
            self._serve_buffered()

    # A client that does not read its replies must not make us buffer without bound.
    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _serve_buffered(self) -> None:
        state = self._state
        while self._transport is not None:
            try:
                request = take_request(self._buffer)
                if request is None:
                    return
                op, timeout, fields = request
                if state.would_block(op, fields):
                    self._waiting = asyncio.get_running_loop().create_task(
                        self._answer_later(op, fields, timeout)
                    )
                    return
                status, out = state.apply(op, fields)
            except ValueError as exc:  # garbage on the wire: say why once, then hang up
                self._transport.write(pack_reply(Status.ERROR, [str(exc).encode()]))
                self._transport.close()
                return
            self._transport.write(pack_reply(status, out))

    async def _answer_later(self, op: int, fields: list[bytes], timeout: float) -> None:
        try:
            status, out = await self._state.apply_blocking(op, fields, timeout)
        except ValueError as exc:
            status, out = Status.ERROR, [str(exc).encode()]
        self._waiting = None
        if self._transport is not None:
            self._transport.write(pack_reply(status, out))
            self._serve_buffered()
