"""etcd's v3 JSON gateway over several members, with the standard library's ``http.client``.

Why no client library: ``etcd3`` on PyPI is unmaintained and pins an old protobuf, and a
gRPC stack would be cclctl's heaviest dependency for a handful of calls. The gateway is
etcd's own (``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/watch``, ...), served on every client
port since etcd 3.4, so cclctl needs nothing new.

A :class:`Gateway` talks to one member at a time on one kept-alive connection, behind one
lock. When that member cannot be reached (refused, reset, no answer in time) it moves to the
next one and sends the request again if that is safe: always when the request never left,
else only for requests marked idempotent (reads, a ``put`` of the same bytes). A
transaction whose answer was lost is ambiguous (it may have been applied), so it fails with
a :class:`StoreError` that says so, as the embedded store's client does. Streams (watches)
get a connection of their own, so a blocking wait never holds up another request.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import threading
import time
from typing import Any

from cclctl.errors import StoreError, StoreTimeout
from cclctl.store.etcd.credentials import PASSWORD_FILE, USER, Credentials
from cclctl.store.etcd.stream import Stream, reason

#: The longest one try at one member may take before the next member is tried: a member
#: that hangs (partitioned, stopped) must not take a request's whole deadline.
ATTEMPT_S = 3.0
#: gRPC codes after which another member may answer: unavailable (no leader, stopping),
#: deadline exceeded (a slow raft round). Only idempotent requests are sent again.
RETRYABLE_CODES = frozenset({4, 14})
#: etcd's code for an unknown lease (it expired, or the cluster lost it).
LEASE_NOT_FOUND = 5
#: etcd's code for a token it no longer knows (it expired): authenticate again.
UNAUTHENTICATED = 16
#: etcd's code for a user without the permission a request needs.
PERMISSION_DENIED = 7
_HEADERS = {"Content-Type": "application/json"}
_LOST = (OSError, http.client.HTTPException)


class EtcdRefused(StoreError):
    """A member answered with an error (``code``: etcd's gRPC code)."""


class Gateway:
    """Requests to an etcd cluster's gateway, moving between members as they come and go."""

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        *,
        max_retry_delay_s: float = 0.5,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials``: the user and TLS files (:mod:`.credentials`; None: none)."""
        if not endpoints:
            raise StoreError("an etcd store needs at least one member's HOST:PORT")
        self.credentials = credentials or Credentials()
        self._ssl = self.credentials.ssl_context()
        self._auth_token = ""  # what authenticating as the user gave, sent with each request
        self.endpoints = list(endpoints)
        self.max_retry_delay_s = max_retry_delay_s
        self.failovers = 0  # times a request moved to another member
        self._current = 0
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    @property
    def member(self) -> str:
        """The member requests go to now, as ``host:port``."""
        host, port = self.endpoints[self._current]
        return f"{host}:{port}"

    def call(
        self, path: str, body: dict[str, Any], *, idempotent: bool, within_s: float
    ) -> dict[str, Any]:
        """One request and its decoded reply, trying members until ``within_s`` passes."""
        self._check_process()
        deadline = time.monotonic() + within_s
        data = json.dumps(body).encode()
        with self._lock:
            tries, delay, why, renewed = 0, 0.0, "", False
            while True:
                if self._closed:
                    raise StoreError(f"the connection to etcd at {self.member} is closed")
                try:
                    if self.credentials.user and not self._auth_token:
                        self._authenticate(deadline)
                    return self._attempt(path, data, deadline, idempotent)
                except _Retry as retry:
                    why = retry.why
                except EtcdRefused as refused:
                    if refused.fields.get("code") != UNAUTHENTICATED or renewed:
                        raise
                    self._auth_token, renewed = "", True  # it expired: once more, anew
                    continue
                tries += 1
                self._move_on()
                if tries % len(self.endpoints) == 0:  # every member tried: back off
                    delay = min(max(delay * 2, 0.05), self.max_retry_delay_s)
                    if time.monotonic() + delay >= deadline:
                        raise StoreTimeout(
                            f"no member of etcd {self._names()} answered within "
                            f"{within_s:g}s: {why}",
                            address=self._names(),
                        )
                    time.sleep(delay)

    def _attempt(self, path: str, data: bytes, deadline: float, idempotent: bool) -> dict[str, Any]:
        """One try at the current member; _Retry when another member should be tried."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreTimeout(f"etcd at {self.member} did not answer in time", address=self.member)
        conn = self._connection(min(left, ATTEMPT_S))
        sent = False
        try:
            conn.request("POST", path, body=data, headers=self._headers())
            sent = True
            response = conn.getresponse()
            raw = response.read()
        except _LOST as exc:
            self._drop()
            if sent and not idempotent:
                raise StoreError(
                    f"lost the connection to etcd at {self.member}: {reason(exc)}; the "
                    "request may have been applied, so it is not repeated",
                    address=self.member,
                ) from None
            raise _Retry(f"{self.member}: {reason(exc)}") from None
        reply = _decode(raw)
        if response.status == 200 and reply is not None and "error" not in reply:
            return reply
        reply = reply or {}
        code = int(reply.get("code", 0))
        message = str(reply.get("message") or reply.get("error") or f"HTTP {response.status}")
        if code in RETRYABLE_CODES and idempotent:
            raise _Retry(f"{self.member}: {message}")
        raise EtcdRefused(
            f"etcd at {self.member} refused: {message}{self._hint(message, code)}", code=code
        )

    def _authenticate(self, deadline: float) -> None:
        """Authenticate as the user at the current member: its token goes with each
        request until etcd forgets it (then :meth:`call` authenticates again)."""
        creds = self.credentials
        body = json.dumps({"name": creds.user, "password": creds.password}).encode()
        reply = self._attempt("/v3/auth/authenticate", body, deadline, idempotent=True)
        token = reply.get("token")
        if not isinstance(token, str) or not token:
            raise EtcdRefused(f"etcd at {self.member} gave no token to user {creds.user!r}")
        self._auth_token = token

    def _headers(self) -> dict[str, str]:
        if not self._auth_token:
            return _HEADERS
        return {**_HEADERS, "Authorization": self._auth_token}

    def _hint(self, message: str, code: int) -> str:
        """What to do about a refusal that is about who cclctl is."""
        user = self.credentials.user
        if "user name is empty" in message:
            return f" (the cluster checks users: set {USER} and {PASSWORD_FILE})"
        if "invalid user ID or password" in message:
            return f" (user {user!r}, {USER} and {PASSWORD_FILE})"
        if code == PERMISSION_DENIED:
            return f" (user {user!r} needs readwrite on the prefix cclctl/)"
        return ""

    def open_stream(self, path: str, body: dict[str, Any], within_s: float) -> Stream:
        """A streaming request (a watch) on a connection of its own, at the first member
        that takes it within ``within_s``; the stream's first message is read by the caller."""
        self._check_process()
        deadline = time.monotonic() + within_s
        data = json.dumps(body).encode()
        tries, delay = 0, 0.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._closed:
                raise StoreTimeout(
                    f"no member of etcd {self._names()} took a watch in time",
                    address=self._names(),
                )
            host, port = self.endpoints[self._current]
            conn = self._new_connection(host, port, min(left, ATTEMPT_S))
            try:
                conn.request("POST", path, body=data, headers=self._headers())
                response = conn.getresponse()
                if response.status == 200:
                    return Stream(conn, response, f"{host}:{port}")
                conn.close()
            except _LOST:
                conn.close()
            tries += 1
            self.lost_member(f"{host}:{port}")
            if tries % len(self.endpoints) == 0:
                delay = min(max(delay * 2, 0.05), self.max_retry_delay_s)
                time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))

    def lost_member(self, member: str) -> None:
        """A stream found ``member`` gone: move on, unless another request already did."""
        if member == self.member:
            self._move_on()

    def _move_on(self) -> None:
        self._drop()
        self._current = (self._current + 1) % len(self.endpoints)
        self.failovers += 1

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        """The kept-alive connection to the current member; one the member closed while it
        sat idle (readable: an end of file, or bytes nobody asked for) is made anew."""
        conn = self._conn
        if conn is not None and conn.sock is not None:
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if readable:
                self._drop()
                conn = None
        if conn is None:
            host, port = self.endpoints[self._current]
            conn = self._conn = self._new_connection(host, port, timeout_s)
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn

    def _new_connection(self, host: str, port: int, timeout_s: float) -> http.client.HTTPConnection:
        if self._ssl is None:
            return http.client.HTTPConnection(host, port, timeout=timeout_s)
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=self._ssl)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

    def _names(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.endpoints)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise StoreError(
                f"the connection to etcd at {self._names()} belongs to process {self._pid}; "
                "a process forked from it must open its own"
            )

    def close(self) -> None:
        """Close the kept-alive connection; later requests fail."""
        self._closed = True
        if os.getpid() != self._pid:
            self._conn = None
            return
        if self._lock.acquire(timeout=ATTEMPT_S):
            try:
                self._drop()
            finally:
                self._lock.release()


class _Retry(Exception):
    """This member did not answer; another may (``why``: what happened)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _decode(raw: bytes) -> dict[str, Any] | None:
    """A reply's JSON object; None when it is not one (not etcd's gateway)."""
    try:
        reply = json.loads(raw) if raw else {}
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None
