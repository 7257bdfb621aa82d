"""The job's control plane: a small TCP key-value store and its blocking client.

Ranks use it to find each other (rendezvous), publish status and raise aborts. Each
request is one round trip on a :class:`~cclctl.store.channel.StoreChannel`, which heals a
lost connection; blocking calls (``get``, ``wait``) time out on the server, so a slow key
reads as a clear :class:`StoreTimeout` naming the key rather than a dead socket.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cclctl.errors import StoreError, StoreTimeout
from cclctl.store.channel import StoreChannel
from cclctl.store.protocol import Op, Status
from cclctl.store.server import StoreServer

__all__ = ["StoreClient", "StoreServer", "parse_address"]


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) -> ``(host, port)``."""
    host, sep, port_text = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise StoreError(f"{address!r} is not a store address: expected HOST:PORT")
    return host, int(port_text)


def _describe_keys(keys: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(key) for key in keys[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"key {shown}" if len(keys) == 1 else f"keys {shown}{more}"


class StoreClient(StoreChannel):
    """A connection to a :class:`StoreServer`; thread-safe (requests take turns).

    With ``token`` the client proves it as it connects (and the store proves it back, so a
    fake store is found out at once); without one it may only read the job's statuses from
    a store that has a token, and do everything on one that has none.
    """

    @classmethod
    def from_address(cls, address: str, **kw: Any) -> StoreClient:
        host, port = parse_address(address)
        return cls(host, port, **kw)

    def set(self, key: str, value: bytes) -> None:
        self._request(Op.SET, [key.encode(), bytes(value)])

    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Set every key in one request: a reader sees all of them set or none."""
        self._request(Op.SET_MANY, [part for key, value in items.items()
                                    for part in (key.encode(), bytes(value))])  # fmt: skip

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

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
