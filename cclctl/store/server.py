"""The store's server: one asyncio loop in one daemon thread serves every client.

Ten thousand connected ranks, most of them waiting, cost no threads (see
:mod:`cclctl.store.connection`). With a token, only clients that prove it may write (see
:mod:`cclctl.store.access`); :class:`~cclctl.store.limits.StoreLimits` bounds what any
client may cost, and a sweep on the loop enforces its deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from cclctl.errors import StoreError
from cclctl.store.connection import Connection
from cclctl.store.limits import REASONS, EventLog, StoreLimits
from cclctl.store.linger import Linger, mark_ended, watch
from cclctl.store.state import StoreState

LISTEN_BACKLOG = 4096  # ranks connect in a burst at start-up; the kernel caps it at somaxconn


class StoreServer:
    """A key-value store on ``host:port``, served from a background thread until closed.

    With ``token``, a client that does not prove it may only read the job's statuses (what
    ``cclctl top`` reads); every store cclctl starts has one. Without a token the store is
    open to anyone who reaches the port: for tests and trusted setups only.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        limits: StoreLimits | None = None,
        linger: Linger | None = None,
    ) -> None:
        self.host = host
        self._port = port
        self.token = token or None
        self.limits = limits or StoreLimits()
        self.linger = linger  # None: serve until closed; else stop a grace after the last rank
        self.member_left = 0.0  # loop time a rank's connection last closed
        self.ended = False  # a lingering store's ranks all left: its job is over
        self.state = StoreState()
        self.events = EventLog(f"{host}:{port}")
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._connections: dict[Connection, None] = {}  # in order of arrival
        self._buffered = 0

    @property
    def rejected(self) -> dict[str, int]:
        """Connections closed by a limit or a failed proof, by reason (every reason in
        limits.REASONS, zero or more)."""
        return {reason: self.events.rejected[reason] for reason in REASONS}

    @property
    def refused(self) -> int:
        """Requests refused to a connection without the token."""
        return self.events.refused

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def members(self) -> int:
        """Connections of ranks (see :attr:`Connection.member`); readers are not counted."""
        return sum(1 for conn in list(self._connections) if conn.member)

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
                errno=exc.errno or 0,
            ) from None
        self._port = int(self._sock.getsockname()[1])
        self.events.address = self.address
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

    def wait(self) -> None:
        """Block until the server stops (a lingering store: its grace after the last rank)."""
        if self._thread is not None:
            self._thread.join()

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

    # Called by connections, on the loop.

    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def admit(self, conn: Connection) -> None:
        """Register a new connection; at the cap, drop the oldest idle one to make room."""
        if len(self._connections) >= self.limits.connection_cap():
            victim = self._oldest_idle()
            if victim is None:
                self._connections[conn] = None
                conn.reject("full", f"{len(self._connections) - 1} connections, none idle")
                return
            victim.reject("evicted", "the oldest idle connection, to make room for a new one")
        self._connections[conn] = None

    def call_soon(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` on the store's loop (from any thread, a signal handler too);
        False if the loop is not running."""
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop already ended
            return False
        return True

    def stop_serving(self) -> None:
        """On the loop: end serving (what :meth:`close` asks from another thread)."""
        if self._stop is not None:
            self._stop.set()

    def forget(self, conn: Connection) -> None:
        was_member = conn in self._connections and conn.member
        if was_member:
            self.member_left = self.now()
        self._connections.pop(conn, None)
        self._buffered -= conn.accounted
        conn.accounted = 0
        if was_member and self.linger is not None and not self.members and not self.ended:
            mark_ended(self)

    def account(self, conn: Connection) -> None:
        """Count a connection's partial frames against max_buffered; over it, close it."""
        self._buffered += conn.buffered - conn.accounted
        conn.accounted = conn.buffered
        if self._buffered > self.limits.buffered_cap:
            conn.reject("memory", f"partial frames hold {self._buffered} bytes in all")

    def _oldest_idle(self) -> Connection | None:
        """The idle connection that has been quiet longest; never one that proved the token
        while a store has a token, so a flood of strangers cannot push a rank out."""
        candidates = [
            c for c in self._connections if c.idle and (self.token is None or not c.authenticated)
        ]
        return min(candidates, key=lambda c: c.last_active, default=None)

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        self._stop = asyncio.Event()
        assert self._sock is not None  # bound by start()
        server = await loop.create_server(
            lambda: Connection(self), sock=self._sock, backlog=LISTEN_BACKLOG
        )
        tasks = [loop.create_task(self._sweep())]
        if self.linger is not None:
            tasks.append(loop.create_task(watch(self, self.linger)))
        ready.set()
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        server.close()
        for connection in list(self._connections):
            connection.close()
        # asyncio.run then cancels the waits that remain.

    async def _sweep(self) -> None:
        """Close connections past their deadlines: a frame too slow, a stranger too quiet."""
        limits = self.limits
        while True:
            await asyncio.sleep(limits.sweep_s)
            now = self.now()
            for conn in list(self._connections):
                started = conn.frame_started
                if started is not None and now - started > limits.frame_timeout_s:
                    conn.reject(
                        "frame_timeout", f"a frame not whole {limits.frame_timeout_s:g}s on"
                    )
                elif (
                    conn.idle
                    and self._may_idle_out(conn)
                    and now - conn.last_active > limits.idle_timeout_s
                ):
                    conn.reject("idle", f"no request for {limits.idle_timeout_s:g}s")

    def _may_idle_out(self, conn: Connection) -> bool:
        """Ranks stay connected, quiet, for a whole job; strangers and silent sockets do not."""
        if self.token is not None:
            return not conn.authenticated
        return conn.requests == 0

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """An error asyncio would print with a traceback (an accept out of descriptors):
        counted and told in one line instead."""
        message = str(context.get("message", ""))
        if "accept" not in message:
            loop.default_exception_handler(context)
            return
        exc = context.get("exception")
        self.events.reject("accept_error", f"{message}: {exc}" if exc else message)
