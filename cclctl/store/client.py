"""The job's control plane: a small TCP key-value store and its blocking client.

Ranks use it to find each other (rendezvous), publish status and raise aborts. The client
is a plain blocking socket behind one lock: a round trip on loopback is a few syscalls, and
blocking calls (``get``, ``wait``) time out on the server, so a slow key reads as a clear
:class:`StoreTimeout` naming the key rather than a dead socket.

A connection belongs to the process that opened it. A process forked from a rank (a
DataLoader worker) inherits the socket, but a request from it would interleave with the
rank's own on the same stream, and shutting it down would cut the rank off: in a fork,
requests fail with a clear :class:`StoreError` and ``close`` only drops the fork's copy.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from cclctl import auth
from cclctl.errors import StoreError, StoreTimeout
from cclctl.store import access
from cclctl.store.protocol import (
    MAX_REPLY_BYTES,
    REPLY_HEADER,
    Op,
    Status,
    field_lengths,
    pack_request,
    split_fields,
)
from cclctl.store.server import StoreServer

__all__ = ["StoreClient", "StoreServer", "parse_address"]

#: Extra time a blocking request waits for the server's own timeout reply.
ANSWER_SLACK_S = 5.0
MAX_RETRY_DELAY_S = 0.5


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) -> ``(host, port)``."""
    host, sep, port_text = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise StoreError(f"{address!r} is not a store address: expected HOST:PORT")
    return host, int(port_text)


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _describe_keys(keys: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(key) for key in keys[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"key {shown}" if len(keys) == 1 else f"keys {shown}{more}"


class StoreClient:
    """A connection to a :class:`StoreServer`; thread-safe (requests take turns).

    With ``token`` the client proves it as it connects (and the store proves it back, so a
    fake store is found out at once); without one it may only read the job's statuses from
    a store that has a token, and do everything on one that has none.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 60.0,
        token: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # the process this connection belongs to (see the module)
        self._sock: socket.socket | None = self._connect(connect_timeout_s)
        self._reader = self._sock.makefile("rb")
        if token:
            self._authenticate(token)

    @classmethod
    def from_address(cls, address: str, **kw: Any) -> StoreClient:
        host, port = parse_address(address)
        return cls(host, port, **kw)

    def _connect(self, connect_timeout_s: float) -> socket.socket:
        """Retry until the deadline: ranks routinely start before the store is up."""
        deadline = time.monotonic() + connect_timeout_s
        delay = 0.01
        while True:
            remaining = deadline - time.monotonic()
            try:
                sock = socket.create_connection(
                    (self.host, self.port), timeout=max(min(remaining, 5.0), 0.05)
                )
            except OSError as exc:
                if time.monotonic() + delay >= deadline:
                    raise StoreTimeout(
                        f"cannot reach the store at {self.address} after "
                        f"{connect_timeout_s:g}s: {_reason(exc)}",
                        address=self.address,
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY_S)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

    def _authenticate(self, token: str) -> None:
        """The token's handshake (see :mod:`cclctl.store.access`); the store proves first."""
        client_nonce = auth.nonce()
        try:
            _, fields = self._request(Op.HELLO, [client_nonce])
        except StoreError as exc:
            self._drop()
            raise StoreError(
                f"{exc.message}; a cclctl job's store has a token: is {self.address} "
                "the job's store?",
                address=self.address,
            ) from None
        if len(fields) != 2 or not auth.verify(
            token, fields[1], access.SERVER_ROLE, client_nonce, fields[0]
        ):
            self._drop()
            raise StoreError(
                f"the store at {self.address} cannot prove it holds the job's token: it is "
                "not this job's store, or the token (CCLCTL_TOKEN) is another job's",
                address=self.address,
                reason="token",
            )
        try:
            self._request(Op.AUTH, [access.client_proof(token, fields[0], client_nonce)])
        except StoreError:
            self._drop()
            raise StoreError(
                f"the store at {self.address} refused the token (CCLCTL_TOKEN): it is "
                "another job's",
                address=self.address,
                reason="token",
            ) from None

    def _request(
        self, op: Op, fields: Sequence[bytes], wait_s: float | None = None
    ) -> tuple[Status, list[bytes]]:
        if os.getpid() != self._pid:  # before the lock, which a fork may inherit held
            raise StoreError(
                f"the connection to the store at {self.address} belongs to process "
                f"{self._pid}; a process forked from it must open its own",
                address=self.address,
            )
        frame = pack_request(op, fields, wait_s)
        answer_within = self.timeout_s if wait_s is None else wait_s + ANSWER_SLACK_S
        with self._lock:
            sock = self._sock
            if sock is None:
                raise StoreError(
                    f"the connection to the store at {self.address} is closed",
                    address=self.address,
                )
            try:
                if sock.gettimeout() != answer_within:
                    sock.settimeout(answer_within)
                sock.sendall(frame)
                status, count = REPLY_HEADER.unpack(self._read(REPLY_HEADER.size))
                if 4 * count > MAX_REPLY_BYTES:
                    raise ValueError(f"a reply of {count} fields is not a store's answer")
                lengths = field_lengths(self._read(4 * count), count)
                payload = self._read(sum(lengths)) if count else b""
            except TimeoutError:
                self._drop()
                raise StoreTimeout(
                    f"the store at {self.address} did not answer within {answer_within:g}s",
                    address=self.address,
                ) from None
            except (OSError, EOFError, ValueError) as exc:
                self._drop()
                if self._closed:
                    raise StoreError(
                        f"the connection to the store at {self.address} is closed",
                        address=self.address,
                    ) from None
                raise StoreError(
                    f"lost the connection to the store at {self.address}: {_reason(exc)}",
                    address=self.address,
                ) from None
        fields_out = split_fields(payload, lengths)
        if status == Status.ERROR:
            message = fields_out[0].decode(errors="replace") if fields_out else "unknown error"
            raise StoreError(f"the store at {self.address} refused: {message}")
        return Status(status), fields_out

    def _read(self, size: int) -> bytes:
        data = self._reader.read(size)
        if len(data) < size:
            raise EOFError("the store closed the connection")
        return data

    def _drop(self) -> None:
        """Forget a connection whose request stream can no longer be trusted."""
        sock, self._sock = self._sock, None
        if sock is not None:
            self._reader.close()
            sock.close()

    def set(self, key: str, value: bytes) -> None:
        self._request(Op.SET, [key.encode(), bytes(value)])

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        """The key's value, waiting until some rank sets it (``timeout_s`` or the default)."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        status, fields = self._request(Op.GET, [key.encode()], wait_s)
        if status == Status.TIMEOUT:
            raise StoreTimeout(
                f"timed out after {wait_s:g}s waiting for key {key!r} "
                f"in the store at {self.address}",
                key=key,
                elapsed=wait_s,
                address=self.address,
            )
        return fields[0]

    def try_get(self, key: str) -> bytes | None:
        status, fields = self._request(Op.TRY_GET, [key.encode()])
        return fields[0] if status == Status.OK else None

    def add(self, key: str, delta: int) -> int:
        """Atomically add ``delta`` to the decimal integer under ``key`` (absent = 0)."""
        _, fields = self._request(Op.ADD, [key.encode(), str(int(delta)).encode()])
        return int(fields[0])

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        """Store ``desired`` if the key holds ``expected`` (None: the key is absent).

        Returns the value stored afterwards: ``desired`` when this call won, the current
        value when it lost, and ``b""`` when it lost because the key does not exist.
        """
        fields = [key.encode(), bytes(desired)]
        if expected is not None:
            fields.append(bytes(expected))
        status, out = self._request(Op.COMPARE_SET, fields)
        return out[0] if status == Status.OK else b""

    def wait(self, keys: Sequence[str], timeout_s: float | None = None) -> None:
        """Return once every key exists; StoreTimeout names the ones still missing."""
        if isinstance(keys, str):
            keys = [keys]
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        status, missing = self._request(Op.WAIT, [key.encode() for key in keys], wait_s)
        if status == Status.TIMEOUT:
            names = [key.decode(errors="replace") for key in missing]
            raise StoreTimeout(
                f"timed out after {wait_s:g}s waiting for {_describe_keys(names)} "
                f"in the store at {self.address}",
                keys=names,
                elapsed=wait_s,
                address=self.address,
            )

    def list(self, prefix: str) -> dict[str, bytes]:
        """Every key that starts with ``prefix``, with its value, in one round trip."""
        _, fields = self._request(Op.LIST, [prefix.encode()])
        return {fields[i].decode(): fields[i + 1] for i in range(0, len(fields), 2)}

    def delete(self, key: str) -> bool:
        status, _ = self._request(Op.DELETE, [key.encode()])
        return status == Status.OK

    def close(self) -> None:
        """Close the connection; a request blocked in another thread fails at once."""
        self._closed = True
        if os.getpid() != self._pid:  # a fork's copy: drop it (not under the lock, which
            with contextlib.suppress(OSError):  # may be inherited held), never shut it down
                self._drop()
            return
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._lock.acquire(timeout=ANSWER_SLACK_S):
            try:
                self._drop()
            finally:
                self._lock.release()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
