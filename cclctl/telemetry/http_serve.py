"""A small HTTP server for ``/metrics``: one thread, bounded connections, a deadline each.

A scrape is one short request, so a connection gets ``request_timeout_s`` to send its
request whole and is closed after one reply. Connections are served by one asyncio loop,
never a thread each, so a thousand half-sent requests cost the rank one thread and at most
``max_connections`` sockets: at the cap, the oldest connection still sending its request is
dropped to make room, and a real scrape gets in.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import threading
from collections.abc import Callable

MAX_REQUEST_BYTES = 8192
PATHS = ("/metrics", "/")


class MetricsHTTPServer:
    """Serves ``render()`` at ``/metrics`` on ``addr:port`` from one daemon thread."""

    def __init__(
        self,
        render: Callable[[], bytes],
        content_type: str,
        *,
        max_connections: int = 64,
        request_timeout_s: float = 5.0,
    ) -> None:
        self.render = render
        self.content_type = content_type
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.rejected: collections.Counter[str] = collections.Counter()  # by reason
        self.socket: socket.socket | None = None
        self._connections: dict[_Request, None] = {}  # oldest first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self.socket is not None
        return int(self.socket.getsockname()[1])

    def start(self, addr: str, port: int) -> int:
        """Bind now (OSError when taken) and serve in a daemon thread; returns the port."""
        self.socket = socket.create_server((addr, port), backlog=128)
        ready = threading.Event()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(ready),), name="cclctl-metrics", daemon=True
        )
        self._thread.start()
        ready.wait()
        return self.port

    def stop(self) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(timeout=5.0)
        self.close_socket()
        self._loop = self._stop = self._thread = None

    def close_socket(self) -> None:
        if self.socket is not None:
            self.socket.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        assert self.socket is not None  # bound by start()
        server = await loop.create_server(lambda: _Request(self), sock=self.socket)
        ready.set()
        await self._stop.wait()
        server.close()
        for conn in list(self._connections):
            conn.close()

    def admit(self, conn: _Request) -> None:
        if len(self._connections) >= self.max_connections:
            oldest = next(iter(self._connections))
            self.rejected["evicted"] += 1
            oldest.close()
        self._connections[conn] = None

    def forget(self, conn: _Request) -> None:
        self._connections.pop(conn, None)


class _Request(asyncio.Protocol):
    """One connection: read one request within the deadline, answer it, close."""

    def __init__(self, server: MetricsHTTPServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._server.request_timeout_s, self._expire)
        self._server.admit(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._server.forget(self)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._answered:
            return
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_REQUEST_BYTES:
                self._server.rejected["too_large"] += 1
                self._answer(431, b"request header too large\n")
            return
        self._transport.pause_reading()
        self._answer(*self._route(bytes(self._buffer[:end])))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _expire(self) -> None:
        self._server.rejected["timeout"] += 1
        self.close()

    def _route(self, head: bytes) -> tuple[int, bytes]:
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return 400, b"bad request\n"
        method, target = parts[0], parts[1].split(b"?", 1)[0].decode(errors="replace")
        if method not in (b"GET", b"HEAD"):
            return 405, b"only GET and HEAD\n"
        if target not in PATHS:
            return 404, b"not found: metrics are at /metrics\n"
        body = self._server.render()
        return 200, b"" if method == b"HEAD" else body

    def _answer(self, status: int, body: bytes) -> None:
        """Reply and close; the deadline still stands for a client that never reads it."""
        if self._transport is None:
            return
        self._answered = True
        kind = self._server.content_type if status == 200 else "text/plain; charset=utf-8"
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self._transport.write(head.encode() + body)
        self._transport.close()  # once the reply is flushed


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS[431] = "Request Header Fields Too Large"
