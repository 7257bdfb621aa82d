"""One client of the store: its frames, its token handshake, what it may do, its deadlines.

A bare :class:`asyncio.Protocol` (no streams, no task per request): a request that can be
answered now is answered inside ``data_received``, so a round trip costs one loop wake-up.
Only a ``get``/``wait`` on a missing key becomes a task, parked on a future.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
from collections.abc import Sequence
from typing import Protocol

from cclctl import auth
from cclctl.store import access
from cclctl.store.frames import FrameReader, FrameRefused, Request
from cclctl.store.limits import EventLog, StoreLimits
from cclctl.store.protocol import Op, Status, pack_reply
from cclctl.store.state import StoreState


class ConnectionHost(Protocol):
    """What a connection needs of the server that accepted it (its keys, token, limits and
    event log; its clock; its register of connections and of their buffered bytes)."""

    @property
    def state(self) -> StoreState: ...
    @property
    def token(self) -> str | None: ...
    @property
    def limits(self) -> StoreLimits: ...
    @property
    def events(self) -> EventLog: ...
    def now(self) -> float: ...
    def admit(self, conn: Connection) -> None: ...
    def forget(self, conn: Connection) -> None: ...
    def account(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One client. Requests are answered in order; a blocking one holds back the rest."""

    def __init__(self, server: ConnectionHost) -> None:
        self._server = server
        self._state = server.state
        self.authenticated = server.token is None  # an open store trusts every client
        max_frame = server.limits.max_frame if self.authenticated else access.READ_ONLY_MAX_FRAME
        self._reader = FrameReader(max_frame, server.limits.max_fields)
        self._transport: asyncio.Transport | None = None
        self._waiting: asyncio.Task[None] | None = None
        self._nonces: tuple[bytes, bytes] | None = None  # (client's, server's) after HELLO
        self.requests = 0
        self.wrote = False  # made a request beyond the read-only set (a rank does at once)
        self.only_read = False  # made read-only requests and nothing else (top, diagnose)
        self.last_active = 0.0  # loop time of the last whole request (or the connect)
        self.frame_started: float | None = None  # loop time of a partial frame's first byte
        self.accounted = 0  # bytes of partial frames the server counts against max_buffered

    @property
    def buffered(self) -> int:
        return self._reader.buffered

    @property
    def member(self) -> bool:
        """A rank's connection: proved the token and has not shown itself a reader only
        (``cclctl top`` or ``diagnose`` with the token, or a host agent, which writes only
        its host's document); a lingering store waits for these."""
        return self.authenticated and (self.wrote or not self.only_read)

    @property
    def idle(self) -> bool:
        """Nothing in flight: no partial frame, no request waiting for a key."""
        return self.frame_started is None and self._waiting is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.last_active = self._server.now()
        self._server.admit(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.forget(self)
        if self._waiting is not None:
            self._waiting.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._reader.buffered == 0:
            self.frame_started = self._server.now()
        self._reader.feed(data)
        if self._waiting is None:
            self._serve_buffered()
        elif self._reader.buffered > self._reader.max_frame:  # pipelining past a frame
            self.reject("frame_too_large", "a client sent more than a frame ahead")
        if self._transport is not None:
            self._server.account(self)

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

    def reject(self, reason: str, detail: str, reply: bool = False) -> None:
        """Close this connection for ``reason`` (counted and logged once a minute)."""
        if self._transport is None:
            return
        self._server.events.reject(reason, detail)
        if reply:
            self._transport.write(pack_reply(Status.ERROR, [detail.encode()]))
        self._server.forget(self)
        self._transport.close()
        self._transport = None

    def _serve_buffered(self) -> None:
        while self._transport is not None:
            try:
                request = self._reader.take()
            except FrameRefused as exc:
                self.reject(exc.reason, str(exc), reply=True)
                return
            if request is None:
                return
            self.requests += 1
            self.last_active = now = self._server.now()
            self.frame_started = None if self._reader.buffered == 0 else now
            if not self._serve(request):
                return

    def _serve(self, request: Request) -> bool:
        """Answer one request; False when it now waits for a key (or the connection ended)."""
        op, fields = request.op, request.fields
        if op in (Op.HELLO, Op.AUTH):
            return self._handshake(op, fields)
        if not self.authenticated:
            why = access.refusal(op, fields)
            if why is not None:
                self._server.events.refuse(why)
                return self._reply(Status.ERROR, [why.encode()])
        if access.reads_only(op, fields) or access.is_agents(op, fields):
            self.only_read = not self.wrote
        else:
            self.wrote = True
        state = self._state
        try:
            if state.would_block(op, fields):
                self._waiting = asyncio.get_running_loop().create_task(
                    self._answer_later(op, fields, request.timeout)
                )
                return False
            status, out = state.apply(op, fields)
        except ValueError as exc:  # garbage on the wire: say why once, then hang up
            self.reject("malformed", str(exc), reply=True)
            return False
        if op == Op.LIST and not self.authenticated:
            out = access.public_listing(out)
        return self._reply(status, out)

    def _reply(self, status: Status, fields: Sequence[bytes] = ()) -> bool:
        if self._transport is None:
            return False
        self._transport.write(pack_reply(status, fields))
        return True

    def _handshake(self, op: int, fields: list[bytes]) -> bool:
        token = self._server.token
        if token is None:
            return self._reply(Status.ERROR, [b"this store has no token"])
        if op == Op.HELLO:
            if self._nonces is not None or len(fields) != 1 or not 16 <= len(fields[0]) <= 64:
                self.reject("malformed", "a second or malformed HELLO", reply=True)
                return False
            self._nonces = (fields[0], auth.nonce())
            client_nonce, server_nonce = self._nonces
            return self._reply(
                Status.OK, [server_nonce, access.server_proof(token, client_nonce, server_nonce)]
            )
        if self._nonces is None or self.authenticated or len(fields) != 1:
            self.reject("malformed", "AUTH without a HELLO", reply=True)
            return False
        client_nonce, server_nonce = self._nonces
        expected = access.client_proof(token, server_nonce, client_nonce)
        if not hmac.compare_digest(fields[0], expected):
            self.reject("bad_proof", "a wrong proof of the job's token", reply=True)
            return False
        self.authenticated = True
        self._reader.max_frame = self._server.limits.max_frame
        return self._reply(Status.OK)

    async def _answer_later(self, op: int, fields: list[bytes], timeout: float) -> None:
        try:
            status, out = await self._state.apply_blocking(op, fields, timeout)
        except ValueError as exc:
            status, out = Status.ERROR, [str(exc).encode()]
        self._waiting = None
        self.last_active = self._server.now()
        if self._transport is not None:
            self._transport.write(pack_reply(status, out))
            self._serve_buffered()
