"""The job's store on etcd: :class:`EtcdClient`, the methods and errors of
:class:`~cclctl.store.client.StoreClient` over etcd's JSON gateway.

``set``, ``get``, ``try_get``, ``wait``, ``list`` and ``delete`` map onto etcd's put, range
(a blocking read: a range then a watch, :mod:`~cclctl.store.etcd.watch`) and deleterange;
``compare_set`` and ``add`` are transactions on the key's value or its revision. Keys are
written under the client's lease (:mod:`~cclctl.store.etcd.lease`). The job's token is not
checked by etcd, which has its own users and TLS (:mod:`~cclctl.store.etcd.credentials`,
``docs/security.md``); it is accepted and unused, so callers pass it as they do to the
embedded store.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from cclctl.errors import StoreError, StoreTimeout
from cclctl.store.etcd.address import format_endpoints, parse_endpoints
from cclctl.store.etcd.codec import b64, number, prefix_end, unb64
from cclctl.store.etcd.credentials import Credentials
from cclctl.store.etcd.credentials import from_env as credentials_from_env
from cclctl.store.etcd.gateway import LEASE_NOT_FOUND, EtcdRefused, Gateway
from cclctl.store.etcd.lease import DEFAULT_LEASE_TTL_S, Lease
from cclctl.store.etcd.watch import await_keys

#: How many times ``add`` reads and writes again when another client changed the key between.
ADD_TRIES = 100


class EtcdClient:
    """A client of an etcd cluster, thread-safe; it moves between members as they fail."""

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 60.0,
        token: str | None = None,
        max_retry_delay_s: float = 0.5,
        lease_ttl_s: float | None = DEFAULT_LEASE_TTL_S,
        credentials: Credentials | None = None,
    ) -> None:
        """Reaches a member within ``connect_timeout_s`` (StoreTimeout otherwise).
        ``token``: unused (see the module). ``lease_ttl_s``: see :class:`Lease`.
        ``credentials``: the user and TLS files (None: the ``CCLCTL_ETCD_*`` variables',
        :mod:`~cclctl.store.etcd.credentials`)."""
        del token
        self.endpoints = list(endpoints)
        self.host, self.port = self.endpoints[0]
        self.address = format_endpoints(self.endpoints)
        self.timeout_s = timeout_s
        self._gateway = Gateway(
            self.endpoints,
            max_retry_delay_s=max_retry_delay_s,
            credentials=credentials_from_env() if credentials is None else credentials,
        )
        self._lease = Lease(self._gateway, lease_ttl_s)
        self._gateway.call(
            "/v3/maintenance/status", {}, idempotent=True, within_s=connect_timeout_s
        )

    @classmethod
    def from_address(cls, address: str, **kw: Any) -> EtcdClient:
        """A client of the cluster ``etcd://host:port,...`` names."""
        return cls(parse_endpoints(address), **kw)

    @property
    def reconnects(self) -> int:
        """Times a request moved to another member after losing one."""
        return self._gateway.failovers

    @property
    def member(self) -> str:
        """The member requests go to now (``host:port``)."""
        return self._gateway.member

    def _call(self, path: str, body: dict[str, Any], idempotent: bool) -> dict[str, Any]:
        return self._gateway.call(path, body, idempotent=idempotent, within_s=self.timeout_s)

    def _write(self, path: str, make: Any, idempotent: bool) -> dict[str, Any]:
        """A request that puts under the lease (``make(lease_id)`` builds it), granted
        again once if the cluster no longer knows the lease."""
        lease_id = self._lease.current()
        try:
            return self._call(path, make(lease_id), idempotent)
        except EtcdRefused as exc:
            if exc.fields.get("code") != LEASE_NOT_FOUND or not lease_id:
                raise
        self._lease.lost(lease_id)
        return self._call(path, make(self._lease.current()), idempotent)

    def set(self, key: str, value: bytes) -> None:
        self._write("/v3/kv/put", lambda lease: _put(key.encode(), bytes(value), lease), True)

    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Every key in one transaction: a reader sees all of them set or none."""
        self._write(
            "/v3/kv/txn",
            lambda lease: {
                "success": [
                    {"request_put": _put(key.encode(), bytes(value), lease)}
                    for key, value in items.items()
                ]
            },
            True,
        )

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        """The key's value, waiting until some client sets it (``timeout_s`` or the default)."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        raw = key.encode()
        found, missing = await_keys(self._gateway, [raw], time.monotonic() + wait_s, values=True)
        if missing:
            raise StoreTimeout(
                f"timed out after {wait_s:g}s waiting for key {key!r} in the store at "
                f"{self.address}",
                key=key,
                elapsed=wait_s,
                address=self.address,
            )
        return found[raw]

    def try_get(self, key: str) -> bytes | None:
        reply = self._call("/v3/kv/range", {"key": b64(key)}, True)
        kvs = reply.get("kvs") or []
        return unb64(kvs[0].get("value")) if kvs else None

    def add(self, key: str, delta: int) -> int:
        """Atomically add ``delta`` to the decimal integer under ``key`` (absent = 0)."""
        raw = key.encode()
        for _ in range(ADD_TRIES):
            reply = self._call("/v3/kv/range", {"key": b64(raw)}, True)
            kvs = reply.get("kvs") or []
            revision = number(kvs[0], "mod_revision") if kvs else 0
            try:
                total = (int(unb64(kvs[0].get("value"))) if kvs else 0) + int(delta)
            except ValueError:
                raise StoreError(
                    f"the store at {self.address} refused: key {key!r} does not hold an integer"
                ) from None
            target = {"target": "MOD", "mod_revision": str(revision)}
            if not kvs:
                target = {"target": "CREATE", "create_revision": "0"}
            compare = dict(key=b64(raw), result="EQUAL", **target)
            done = self._write(
                "/v3/kv/txn",
                lambda lease, t=total, c=compare: {
                    "compare": [c],
                    "success": [{"request_put": _put(raw, str(t).encode(), lease)}],
                },
                False,
            )
            if done.get("succeeded"):
                return total
        raise StoreError(f"add to key {key!r} lost {ADD_TRIES} races in a row at {self.address}")

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        """Store ``desired`` if the key holds ``expected`` (None: the key is absent).

        Returns the value stored afterwards: ``desired`` when this call won, the current
        value when it lost, and ``b""`` when it lost because the key does not exist.
        """
        raw = key.encode()
        if expected is None:
            compare = {"key": b64(raw), "result": "EQUAL", "target": "CREATE"}
            compare["create_revision"] = "0"
        else:
            compare = {"key": b64(raw), "result": "EQUAL", "target": "VALUE"}
            compare["value"] = b64(bytes(expected))
        reply = self._write(
            "/v3/kv/txn",
            lambda lease: {
                "compare": [compare],
                "success": [{"request_put": _put(raw, bytes(desired), lease)}],
                "failure": [{"request_range": {"key": b64(raw)}}],
            },
            False,
        )
        if reply.get("succeeded"):
            return bytes(desired)
        responses = reply.get("responses") or [{}]
        kvs = responses[0].get("response_range", {}).get("kvs") or []
        return unb64(kvs[0].get("value")) if kvs else b""

    def wait(self, keys: Sequence[str], timeout_s: float | None = None) -> None:
        """Return once every key exists; StoreTimeout names the ones still missing."""
        if isinstance(keys, str):
            keys = [keys]
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        if not keys:
            return
        _, missing = await_keys(
            self._gateway, [key.encode() for key in keys], time.monotonic() + wait_s,
            values=False,
        )  # fmt: skip
        if missing:
            names = [key.decode(errors="replace") for key in missing]
            shown = ", ".join(repr(name) for name in names[:5])
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            what = f"key {shown}" if len(names) == 1 else f"keys {shown}{more}"
            raise StoreTimeout(
                f"timed out after {wait_s:g}s waiting for {what} in the store at {self.address}",
                keys=names,
                elapsed=wait_s,
                address=self.address,
            )

    def list(self, prefix: str) -> dict[str, bytes]:
        """Every key that starts with ``prefix``, with its value, in one request."""
        raw = prefix.encode()
        body = {"key": b64(raw or b"\x00"), "range_end": b64(prefix_end(raw))}
        reply = self._call("/v3/kv/range", body, True)
        return {
            unb64(kv.get("key")).decode(errors="replace"): unb64(kv.get("value"))
            for kv in reply.get("kvs") or ()
        }

    def delete(self, key: str) -> bool:
        reply = self._call("/v3/kv/deleterange", {"key": b64(key)}, False)
        return number(reply, "deleted") > 0

    def ping(self) -> None:
        """One round trip to a member (StoreError when none answers)."""
        self._call("/v3/maintenance/status", {}, True)

    def close(self) -> None:
        """Stop the lease's keep-alive (its keys linger for its TTL) and the connection."""
        self._lease.close()
        self._gateway.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _put(key: bytes, value: bytes, lease: int) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return body
