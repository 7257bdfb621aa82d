"""A store client opened at its first request (cclctl/store/lazy.py): the status link's own
connection, which a rank its host agent serves never opens."""

from __future__ import annotations

import pytest

from cclctl.errors import StoreError
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.lazy import LazyStore


def test_nothing_is_opened_until_a_request_and_then_once(server: StoreServer) -> None:
    opened: list[StoreClient] = []

    def opener() -> StoreClient:
        opened.append(StoreClient.from_address(server.address))
        return opened[-1]

    lazy = LazyStore(server.address, opener, timeout_s=5)
    assert (lazy.host, lazy.port, lazy.address) == (server.host, server.port, server.address)
    assert not lazy.opened and lazy.reconnects == 0 and opened == []
    lazy.set("k", b"1")
    assert lazy.compare_set("c", None, b"x") == b"x" and lazy.add("n", 2) == 2
    assert lazy.get("k", timeout_s=1) == b"1" and lazy.try_get("none") is None
    lazy.wait(["k"], timeout_s=1)
    assert lazy.list("") == {"k": b"1", "c": b"x", "n": b"2"}
    assert lazy.delete("c") and len(opened) == 1 and lazy.opened
    lazy.close()
    with pytest.raises(StoreError, match="closed"):
        lazy.set("k", b"2")


def test_closing_one_never_opened_opens_nothing(server: StoreServer) -> None:
    def opener() -> StoreClient:
        raise AssertionError("opened")

    with LazyStore(server.address, opener, timeout_s=5) as lazy:
        assert not lazy.opened
