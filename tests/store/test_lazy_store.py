"""A store client opened at its first request (cclctl/store/lazy.py): the status link's own
connection, which a rank its host agent serves never opens."""

from __future__ import annotations

import threading

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


def test_a_close_while_it_connects_does_not_wait_and_the_request_fails(server) -> None:
    connecting, go_on = threading.Event(), threading.Event()
    opened: list[StoreClient] = []

    def opener() -> StoreClient:
        connecting.set()
        go_on.wait(30)  # a connect that takes its time
        opened.append(StoreClient.from_address(server.address))
        return opened[-1]

    lazy = LazyStore(server.address, opener, timeout_s=5)
    failed: list[Exception] = []

    def request() -> None:
        try:
            lazy.set("k", b"1")
        except StoreError as exc:
            failed.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    assert connecting.wait(30)
    lazy.close()  # returns while the connect is still under way
    go_on.set()
    thread.join(30)
    assert len(failed) == 1 and "closed" in str(failed[0])
    assert not lazy.opened and len(opened) == 1
    with pytest.raises(StoreError, match="closed"):
        opened[0].try_get("k")  # the connection it opened was closed ...
    with StoreClient.from_address(server.address) as reader:
        assert reader.try_get("k") is None  # ... before the request was sent
