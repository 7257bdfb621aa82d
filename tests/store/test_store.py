"""The rendezvous store over real loopback sockets: operations, blocking waits, races, scale."""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from store_attacks import closed_by_peer
from store_attacks import connect as raw_socket
from store_waits import until_waiting

from cclctl.errors import StoreError
from cclctl.store.client import StoreClient, StoreServer, parse_address
from cclctl.store.protocol import Op, pack_request


def connect(server: StoreServer, **kw: Any) -> StoreClient:
    return StoreClient("127.0.0.1", server.port, connect_timeout_s=5, **kw)


def run_threads(n: int, body: Callable[[int], Any], timeout_s: float = 20) -> list[Any]:
    """Run ``body(i)`` on n threads; results by index; re-raise the first error."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            results[i] = body(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "threads did not finish"
    if errors:
        raise errors[0]
    return results


@pytest.mark.timeout(10)
def test_set_get_try_get_delete_and_binary_values(client: StoreClient) -> None:
    blob = bytes(range(256)) * 4
    client.set("a", blob)
    client.set("empty", b"")
    assert client.get("a") == blob
    assert client.get("empty") == b""
    assert client.try_get("nope") is None
    assert client.try_get("empty") == b""
    assert client.delete("a") is True
    assert client.delete("a") is False
    assert client.try_get("a") is None


@pytest.mark.timeout(10)
def test_list_returns_only_the_prefix(client: StoreClient) -> None:
    for rank in range(5):
        client.set(f"status/{rank}", f"s{rank}".encode())
    client.set("statusx", b"no")
    client.set("other/1", b"no")
    assert client.list("status/") == {f"status/{r}": f"s{r}".encode() for r in range(5)}
    assert client.list("missing/") == {}


@pytest.mark.timeout(10)
def test_set_many_sets_every_key_in_one_request(client: StoreClient) -> None:
    client.set("host/h1", b"old")
    client.set_many({"host/h1": b"doc", "head/h1": b"head", "empty": b""})
    assert client.list("h") == {"host/h1": b"doc", "head/h1": b"head"}
    assert client.try_get("empty") == b""


@pytest.mark.timeout(10)
def test_a_set_of_many_keys_without_their_values_is_refused(server: StoreServer) -> None:
    with raw_socket(server.port) as sock:  # key, value, key: one value short
        sock.sendall(pack_request(Op.SET_MANY, [b"a", b"1", b"b"]))
        assert closed_by_peer(sock)
    with StoreClient("127.0.0.1", server.port, timeout_s=5) as fine:
        assert fine.try_get("a") is None  # nothing of it was set


@pytest.mark.timeout(20)
def test_list_returns_ten_thousand_one_kilobyte_keys_in_one_reply(client: StoreClient) -> None:
    value = b"x" * 1024
    for rank in range(10_000):
        client.set(f"status/{rank}", value)
    found = client.list("status/")
    assert len(found) == 10_000 and found["status/9999"] == value


@pytest.mark.timeout(10)
def test_add_and_compare_set_semantics(client: StoreClient) -> None:
    assert client.add("n", 5) == 5
    assert client.add("n", -7) == -2
    assert client.get("n") == b"-2"
    assert client.compare_set("k", None, b"first") == b"first"
    assert client.compare_set("k", None, b"second") == b"first"  # lost: key present
    assert client.compare_set("k", b"wrong", b"third") == b"first"  # lost: mismatch
    assert client.compare_set("k", b"first", b"fourth") == b"fourth"  # won
    assert client.compare_set("absent", b"x", b"y") == b""  # lost: key absent
    assert client.try_get("absent") is None


@pytest.mark.timeout(10)
def test_add_to_a_non_integer_is_a_clear_error(client: StoreClient) -> None:
    client.set("word", b"hello")
    with pytest.raises(StoreError, match=r"key 'word' holds 'hello', not an integer"):
        client.add("word", 1)
    client.set("still", b"works")  # the connection survives the refusal
    assert client.get("still") == b"works"


@pytest.mark.timeout(30)
def test_concurrent_adds_from_threads_are_atomic(server: StoreServer) -> None:
    def body(i: int) -> list[int]:
        with connect(server) as c:
            return [c.add("counter", 1) for _ in range(200)]

    seen = [v for values in run_threads(8, body) for v in values]
    assert sorted(seen) == list(range(1, 1601))  # every increment observed exactly once
    with connect(server) as c:
        assert c.get("counter") == b"1600"


def race_compare_set(server: StoreServer, key: str, n: int) -> list[bytes]:
    """n clients released together by a barrier, each trying to claim ``key`` first."""
    clients = [connect(server) for _ in range(n)]
    start = threading.Barrier(n)

    def body(i: int) -> bytes:
        start.wait()
        return clients[i].compare_set(key, None, f"rank{i}".encode())

    try:
        return run_threads(n, body)
    finally:
        for c in clients:
            c.close()


@pytest.mark.timeout(30)
def test_compare_set_race_has_exactly_one_winner(server: StoreServer) -> None:
    for attempt in range(5):
        results = race_compare_set(server, f"leader/{attempt}", 16)
        assert len(set(results)) == 1  # everyone sees the same winner
        winners = [i for i, value in enumerate(results) if value == f"rank{i}".encode()]
        assert len(winners) == 1


@pytest.mark.timeout(20)
def test_get_blocks_until_another_client_sets_the_key(server: StoreServer) -> None:
    got: list[bytes] = []
    with connect(server) as getter, connect(server) as setter:
        thread = threading.Thread(target=lambda: got.append(getter.get("ready", timeout_s=10)))
        thread.start()
        until_waiting(server, "ready")
        assert got == []  # blocked in the store, not answered
        setter.set("ready", b"go")
        thread.join(10)
    assert got == [b"go"]


@pytest.mark.timeout(30)
def test_many_concurrent_waits_are_all_released_by_one_set(server: StoreServer) -> None:
    waiters = [connect(server) for _ in range(64)]
    try:
        released: list[int] = []

        def body(i: int) -> None:
            waiters[i].wait(["go", "also"], timeout_s=20)
            released.append(i)

        threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(64)]
        for t in threads:
            t.start()
        with connect(server) as c:
            c.set("go", b"1")
            until_waiting(server, "also", 64)  # every waiter saw "go" and waits on
            assert released == []  # "also" is still missing
            c.set("also", b"1")
        for t in threads:
            t.join(10)
        assert sorted(released) == list(range(64))
    finally:
        for w in waiters:
            w.close()


@pytest.mark.timeout(20)
def test_one_client_shared_by_threads(client: StoreClient) -> None:
    def body(i: int) -> list[bytes]:
        out = []
        for j in range(100):
            client.set(f"t{i}/{j}", f"{i}:{j}".encode())
            out.append(client.get(f"t{i}/{j}"))
        return out

    results = run_threads(8, body)
    assert all(r == [f"{i}:{j}".encode() for j in range(100)] for i, r in enumerate(results))


def test_parse_address() -> None:
    assert parse_address("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in ("nohost", "host:", ":80", "host:http", "host:70000"):
        with pytest.raises(StoreError, match="is not a store address"):
            parse_address(bad)


_RAW_WAITERS = r"""
import resource, socket, sys
from cclctl.store.protocol import REPLY_HEADER, Op, pack_request
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]),) * 2)
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
for s in socks:
    s.sendall(pack_request(Op.WAIT, [b"go"], 60.0))
print("waiting", flush=True)
ok = 0
for s in socks:
    s.settimeout(30)
    reply = b""
    while len(reply) < REPLY_HEADER.size:
        reply += s.recv(64)
    ok += REPLY_HEADER.unpack_from(reply)[0] == 0
print(ok, flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_ten_thousand_clients_blocked_in_wait_are_released_by_one_set(
    server: StoreServer,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 10_500:
        pytest.skip(f"needs 10,500 file descriptors, the hard limit is {hard}")
    limit = 20_000 if hard == resource.RLIM_INFINITY else min(hard, 20_000)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, limit), hard))
    child = subprocess.Popen(
        [sys.executable, "-c", _RAW_WAITERS, str(server.port), "10000", str(limit)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "waiting"
        with connect(server) as c:
            c.set("go", b"1")
        assert child.stdout.readline().strip() == "10000"
        assert child.wait(30) == 0
    finally:
        child.kill()
        child.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_request_frames_round_trip_through_the_parser() -> None:
    from cclctl.store.frames import FrameReader, Request

    frame = pack_request(Op.COMPARE_SET, [b"key", b"", b"\x00\xff"], 1.5)
    reader = FrameReader(max_frame=1 << 20, max_fields=16)
    reader.feed(frame[:5])
    assert reader.take() is None  # incomplete: nothing consumed
    reader.feed(frame[5:] + b"extra")
    assert reader.take() == Request(Op.COMPARE_SET, 1.5, [b"key", b"", b"\x00\xff"])
    assert reader.buffered == len(b"extra")
