"""The etcd backend against a real one-member etcd started by the test: every operation
the runtime uses, with the embedded store's semantics (blocking reads, races, leases)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_cluster import EtcdCluster, etcd_cluster, until_watching
from ports import free_port

from cclctl.errors import ConfigError, StoreError, StoreTimeout
from cclctl.store.backends import open_store
from cclctl.store.etcd.client import EtcdClient
from cclctl.store.scope import ScopedStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path_factory.mktemp("etcd"), 1) as running:
        yield running


@pytest.fixture
def etcd(cluster: EtcdCluster, request: pytest.FixtureRequest) -> Iterator[ScopedStore]:
    """A client of the cluster, scoped to this test's own keys."""
    with EtcdClient.from_address(cluster.address, timeout_s=10, connect_timeout_s=5) as client:
        yield ScopedStore(client, f"test/{request.node.name}/")  # type: ignore[arg-type]


def _thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
    thread.start()
    return thread, out


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # the test reads it
        return exc


def test_set_get_try_get_delete_binary_values(etcd: ScopedStore) -> None:
    blob = bytes(range(256)) * 4
    etcd.set("a", blob)
    etcd.set("empty", b"")
    assert etcd.get("a") == blob
    assert etcd.get("empty") == b""
    assert etcd.try_get("nope") is None
    assert etcd.try_get("empty") == b""
    assert etcd.delete("a") is True
    assert etcd.delete("a") is False
    assert etcd.try_get("a") is None


def test_blocking_get_wakes_on_set(etcd: ScopedStore, cluster: EtcdCluster) -> None:
    thread, out = _thread(lambda: etcd.get("late", timeout_s=20))
    until_watching(cluster.client_ports[0])
    etcd.set("late", b"here")
    thread.join(20)
    assert out == [b"here"]


def test_get_timeout_names_the_key(etcd: ScopedStore) -> None:
    with pytest.raises(StoreTimeout) as caught:
        etcd.get("never", timeout_s=0.3)
    assert caught.value.fields["key"] == etcd.prefix + "never"
    assert "never" in str(caught.value) and "etcd://" in str(caught.value)


def test_wait_for_several_keys_and_timeout_names_the_missing(
    etcd: ScopedStore, cluster: EtcdCluster
) -> None:
    etcd.set("k/0", b"")
    thread, out = _thread(lambda: etcd.wait(["k/0", "k/1", "k/2"], timeout_s=20))
    until_watching(cluster.client_ports[0])
    etcd.set("k/2", b"x")
    etcd.set("k/1", b"y")
    thread.join(20)
    assert out == [None]
    with pytest.raises(StoreTimeout) as caught:
        etcd.wait(["k/0", "k/9", "k/8"], timeout_s=0.3)
    assert caught.value.fields["keys"] == [etcd.prefix + "k/8", etcd.prefix + "k/9"]


def test_compare_set_semantics(etcd: ScopedStore) -> None:
    assert etcd.compare_set("cs", None, b"first") == b"first"
    assert etcd.compare_set("cs", None, b"second") == b"first"  # lost: the current value
    assert etcd.compare_set("cs", b"wrong", b"third") == b"first"
    assert etcd.compare_set("cs", b"first", b"third") == b"third"
    assert etcd.compare_set("absent", b"x", b"y") == b""  # lost: the key does not exist
    assert etcd.try_get("absent") is None


def test_compare_set_race_has_one_winner(etcd: ScopedStore) -> None:
    barrier = threading.Barrier(8)

    def claim(i: int) -> bytes:
        barrier.wait(10)
        return etcd.compare_set("claim", None, f"rank {i}".encode())

    runs = [_thread(lambda i=i: claim(i)) for i in range(8)]
    for thread, _ in runs:
        thread.join(30)
    stored = {out[0] for _, out in runs}
    assert len(stored) == 1 and stored == {etcd.try_get("claim")}


def test_add_counts_under_contention(etcd: ScopedStore) -> None:
    assert etcd.add("n", 5) == 5
    assert etcd.add("n", -2) == 3
    runs = [_thread(lambda: [etcd.add("c", 1) for _ in range(10)]) for _ in range(4)]
    for thread, _ in runs:
        thread.join(30)
    seen = sorted(v for _, out in runs for v in out[0])
    assert seen == list(range(1, 41))  # every add got its own total
    assert etcd.get("c") == b"40"
    etcd.set("text", b"abc")
    with pytest.raises(StoreError, match="integer"):
        etcd.add("text", 1)


def test_list_by_prefix(etcd: ScopedStore) -> None:
    etcd.set("status/0", b"a")
    etcd.set("status/1", b"b")
    etcd.set("statusx", b"c")
    etcd.set("other", b"d")
    assert etcd.list("status/") == {"status/0": b"a", "status/1": b"b"}
    assert etcd.list("nothing/") == {}


def test_set_many_sets_every_key_in_one_transaction(etcd: ScopedStore) -> None:
    etcd.set("host/h1", b"old")
    etcd.set_many({"host/h1": b"doc", "head/h1": b"head", "empty": b""})
    assert etcd.list("h") == {"host/h1": b"doc", "head/h1": b"head"}
    assert etcd.try_get("empty") == b""


def test_keys_live_under_the_clients_lease(cluster: EtcdCluster) -> None:
    """A key outlives its writer by the lease's time to live, then goes."""
    with EtcdClient.from_address(cluster.address, lease_ttl_s=2, connect_timeout_s=5) as short:
        short.set("test/lease/k", b"v")
    with EtcdClient.from_address(cluster.address, connect_timeout_s=5) as reader:
        assert reader.try_get("test/lease/k") == b"v"  # the writer closed: it lingers
        thread, out = _thread(lambda: _until_gone(reader, "test/lease/k"))
        thread.join(30)
        assert out == [True]


def _until_gone(client: EtcdClient, key: str) -> bool:
    deadline = time.monotonic() + 20
    while client.try_get(key) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_factory_picks_the_backend_by_address(cluster: EtcdCluster) -> None:
    with open_store(cluster.address, connect_timeout_s=5) as client:  # type: ignore[attr-defined]
        assert isinstance(client, EtcdClient)
        assert client.address == cluster.address
    with pytest.raises(StoreError):
        open_store("127.0.0.1:1", connect_timeout_s=0.2)  # cclctl's store: nothing there
    with pytest.raises(StoreError, match="not an etcd address"):
        EtcdClient.from_address("etcd://nohost")


def test_store_address_checks_accept_etcd() -> None:
    from cclctl.config_check import store_address

    assert store_address("etcd://a:1,b:2", {}) == "etcd://a:1,b:2"
    with pytest.raises(ConfigError, match="--store"):
        store_address("etcd://a:1,b", {})


def test_unreachable_cluster_fails_within_the_connect_timeout() -> None:
    with pytest.raises(StoreTimeout, match="no member of etcd"):
        EtcdClient.from_address(f"etcd://127.0.0.1:{free_port()}", connect_timeout_s=0.5)
