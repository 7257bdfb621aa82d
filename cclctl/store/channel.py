"""The store client's healing connection: one blocking socket behind one lock.

It connects with retry (ranks start before the store is up), proves the job's token on the
raw socket and makes one round trip at a time. A connection lost to a reset is reopened
within the request's deadline (the token proved again), and the request sent again where
that is safe (:data:`IDEMPOTENT`); a store that refuses the new connection has gone.

A connection belongs to the process that opened it: a process forked from a rank (a
DataLoader worker) inherits the socket, but its requests would interleave with the rank's
and shutting it down would cut the rank off. In a fork, requests fail with a clear
:class:`StoreError` and ``close`` only drops the fork's copy.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Sequence

from cclctl import auth
from cclctl.errors import StoreError, StoreTimeout
from cclctl.store import access
from cclctl.store.protocol import (
    MAX_FIELDS,
    MAX_REPLY_BYTES,
    REPLY_HEADER,
    Op,
    Status,
    field_lengths,
    pack_request,
    split_fields,
)
from cclctl.store.store_connect import connect, reason

#: Extra time a blocking request waits for the server's own timeout reply.
ANSWER_SLACK_S = 5.0
#: The longest pause between two tries to reach the store (a connect, or a request sent
#: again), by default; a caller that must notice a returning route sooner passes its own.
MAX_RETRY_DELAY_S = 0.5
#: Requests sent again on a new connection when the old one was lost after they left:
#: repeating them changes nothing (a ``set`` or ``set_many`` writes the same bytes again,
#: as a status publisher does every second; the rest only read). ``add`` would count twice,
#: ``compare_set`` could report its own win as a loss and ``delete`` its own removal as
#: "not found": those fail with a StoreError saying they may have been applied.
IDEMPOTENT = frozenset({Op.SET, Op.SET_MANY, Op.GET, Op.TRY_GET, Op.WAIT, Op.LIST, Op.PING})


class StoreChannel:
    """A healing connection to a store, thread-safe (requests take turns on it)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 60.0,
        token: str | None = None,
        max_retry_delay_s: float = MAX_RETRY_DELAY_S,
    ) -> None:
        """``max_retry_delay_s``: the cap of the backoff between tries (see _connect)."""
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.timeout_s = timeout_s
        self.max_retry_delay_s = max_retry_delay_s
        self._lock = threading.Lock()
        self._closed = False
        self.reconnects = 0  # connections reopened after one was lost (see _request)
        self._pid = os.getpid()  # the process this connection belongs to (see the module)
        self._token = token or None
        self._sock: socket.socket | None = self._connect(connect_timeout_s)
        self._reader = self._sock.makefile("rb")
        if self._token:
            self._authenticate(self._sock, self._token, self.timeout_s)

    def _connect(self, connect_timeout_s: float, refused_is_final: bool = False) -> socket.socket:
        """A connection to the store (:func:`~.store_connect.connect`: retried until the
        deadline; ``refused_is_final`` after a loss)."""
        return connect(
            self.host, self.port, connect_timeout_s, self.max_retry_delay_s, refused_is_final
        )

    def _authenticate(self, sock: socket.socket, token: str, within_s: float) -> None:
        """The token's handshake on ``sock`` (see :mod:`cclctl.store.access`); the store
        proves first. Runs where the connection is made, under the lock after a loss."""
        client_nonce = auth.nonce()
        ok, hello = self._handshake_step(sock, Op.HELLO, [client_nonce], within_s)
        if not ok:
            said = hello[0].decode(errors="replace") if hello else "no answer"
            raise StoreError(
                f"the store at {self.address} refused the handshake: {said}; a cclctl "
                f"job's store has a token: is {self.address} the job's store?",
                address=self.address,
            )
        if len(hello) != 2 or not auth.verify(
            token, hello[1], access.SERVER_ROLE, client_nonce, hello[0]
        ):
            self._drop()
            raise StoreError(
                f"the store at {self.address} cannot prove it holds the job's token: it is "
                "not this job's store, or the token (CCLCTL_TOKEN) is another job's",
                address=self.address,
                reason="token",
            )
        proof = access.client_proof(token, hello[0], client_nonce)
        if not self._handshake_step(sock, Op.AUTH, [proof], within_s)[0]:
            raise StoreError(
                f"the store at {self.address} refused the token (CCLCTL_TOKEN): it is "
                "another job's",
                address=self.address,
                reason="token",
            )

    def _handshake_step(
        self, sock: socket.socket, op: Op, fields: list[bytes], within_s: float
    ) -> tuple[bool, list[bytes]]:
        """One handshake round trip on ``sock``: (True, the reply's fields), or (False,
        the store's words) when it refused, the connection then dropped."""
        try:
            answer = self._round_trip(sock, pack_request(op, fields), within_s, op)
        except StoreTimeout:
            raise
        except StoreError:
            if op is not Op.AUTH:
                raise
            return False, []  # the store closed the connection on a wrong proof
        if isinstance(answer, str):
            self._drop()
            raise StoreError(
                f"lost the connection to the store at {self.address} in the token "
                f"handshake: {answer}",
                address=self.address,
            )
        status, out = answer
        if status != Status.OK:
            self._drop()
            return False, out
        return True, out

    def _request(
        self, op: Op, fields: Sequence[bytes], wait_s: float | None = None
    ) -> tuple[Status, list[bytes]]:
        """One round trip. A connection lost to a reset is reopened (with backoff, within
        this request's deadline) and the request sent again when that is safe: always if
        it never fully left, else only for the ops in :data:`IDEMPOTENT`.
        """
        if os.getpid() != self._pid:  # before the lock, which a fork may inherit held
            raise StoreError(
                f"the connection to the store at {self.address} belongs to process "
                f"{self._pid}; a process forked from it must open its own",
                address=self.address,
            )
        answer_within = self.timeout_s if wait_s is None else wait_s + ANSWER_SLACK_S
        deadline = time.monotonic() + answer_within
        delay, lost = 0.0, ""  # the first retry at once (a reset connection), then backing off
        with self._lock:
            while True:
                sock = self._sock if self._sock is not None else self._reopen(deadline, lost)
                left = deadline - time.monotonic()
                waits = None if wait_s is None else max(left - ANSWER_SLACK_S, 0.0)
                answer = self._round_trip(sock, pack_request(op, fields, waits), left, op)
                if not isinstance(answer, str):
                    status, fields_out = answer
                    break
                lost = answer
                delay = self._back_off(delay, deadline)
        if status == Status.ERROR:
            message = fields_out[0].decode(errors="replace") if fields_out else "unknown error"
            raise StoreError(f"the store at {self.address} refused: {message}")
        return Status(status), fields_out

    def _round_trip(
        self, sock: socket.socket, frame: bytes, within_s: float, op: Op
    ) -> tuple[int, list[bytes]] | str:
        """Send ``frame`` and read the reply; why the connection was lost when that makes
        sending it again on a new one safe (see :meth:`_request`)."""
        sent = False
        try:
            within_s = max(within_s, 0.05)
            if sock.gettimeout() != within_s:
                sock.settimeout(within_s)
            sock.sendall(frame)
            sent = True
            status, count = REPLY_HEADER.unpack(self._read(REPLY_HEADER.size))
            if count > MAX_FIELDS or 4 * count > MAX_REPLY_BYTES:
                raise ValueError(f"a reply of {count} fields is not the store's")
            lengths = field_lengths(self._read(4 * count), count)
            payload = self._read(sum(lengths)) if count else b""
        except TimeoutError:
            self._drop()
            raise StoreTimeout(
                f"the store at {self.address} did not answer within {within_s:.3g}s",
                address=self.address,
            ) from None
        except (OSError, EOFError, ValueError) as exc:
            self._drop()
            if self._closed:
                raise StoreError(
                    f"the connection to the store at {self.address} is closed",
                    address=self.address,
                ) from None
            if isinstance(exc, ValueError) or (sent and op not in IDEMPOTENT):
                unsure = f"; the {op.name.lower()} may have been applied, so it is not repeated"
                raise StoreError(
                    f"lost the connection to the store at {self.address}: {reason(exc)}"
                    + (unsure if sent and op not in IDEMPOTENT else ""),
                    address=self.address,
                ) from None
            return reason(exc)
        return status, split_fields(payload, lengths)

    def _back_off(self, delay: float, deadline: float) -> float:
        """Sleep ``delay`` before the next try and return the one after it; StoreError once
        the request's deadline leaves no time for another try."""
        if time.monotonic() + delay >= deadline:
            raise StoreError(
                f"lost the connection to the store at {self.address} and could not send the "
                "request again in time",
                address=self.address,
            )
        time.sleep(delay)
        return min(max(delay * 2, 0.05), self.max_retry_delay_s)

    def _reopen(self, deadline: float, lost: str = "") -> socket.socket:
        """A new connection in place of a lost one (``lost``: why, in this request),
        retried with backoff until ``deadline`` (StoreTimeout after it); a refused one
        means the store has gone, and fails at once. ``reconnects`` counts them."""
        if self._closed:
            raise StoreError(
                f"the connection to the store at {self.address} is closed", address=self.address
            )
        try:
            self._sock = self._connect(max(deadline - time.monotonic(), 0.05), True)
        except ConnectionRefusedError as exc:
            why = f"lost the connection to the store at {self.address}: {lost}; " if lost else ""
            raise StoreError(
                f"{why}the store at {self.address} is closed: it refuses connections "
                f"({reason(exc)})",
                address=self.address,
            ) from None
        self._reader = self._sock.makefile("rb")
        if self._token:
            self._authenticate(self._sock, self._token, max(deadline - time.monotonic(), 0.05))
        self.reconnects += 1
        assert self._sock is not None  # a failed handshake raised
        return self._sock

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
