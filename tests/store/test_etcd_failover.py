"""The etcd backend when a member goes: a 3-member cluster on loopback whose member the
client talks to is killed (by pid), and a transaction whose answer was lost."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_cluster import EtcdCluster, etcd_cluster, until_watching

from cclctl.errors import StoreError
from cclctl.store.etcd.client import EtcdClient

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path, 3) as running:
        yield running


def test_client_goes_on_through_another_member_when_its_member_is_killed(
    cluster: EtcdCluster,
) -> None:
    client = EtcdClient.from_address(cluster.address, timeout_s=20, connect_timeout_s=5)
    try:
        assert client.member == cluster.member_address(0)
        client.set("job/a", b"before")
        assert client.compare_set("job/cs", None, b"1") == b"1"
        got: list[bytes] = []
        waiter = threading.Thread(target=lambda: got.append(client.get("job/late", 30)))
        waiter.start()
        until_watching(cluster.client_ports[0])  # the blocked get watches on member 0
        cluster.kill(0)
        client.set("job/late", b"after")  # moves to another member
        waiter.join(40)
        assert got == [b"after"]  # the watch was opened again elsewhere and saw it
        assert client.member != cluster.member_address(0)
        assert client.reconnects >= 1
        assert client.get("job/a") == b"before"
        assert client.compare_set("job/cs", b"1", b"2") == b"2"
        assert client.add("job/n", 3) == 3
        assert client.list("job/") == {
            "job/a": b"before",
            "job/cs": b"2",
            "job/late": b"after",
            "job/n": b"3",
        }
        assert client.delete("job/a") is True
    finally:
        client.close()


def test_a_blocked_read_goes_on_when_its_member_stops_answering(cluster: EtcdCluster) -> None:
    client = EtcdClient.from_address(cluster.address, timeout_s=30, connect_timeout_s=5)
    writer = EtcdClient.from_address(
        f"etcd://{cluster.member_address(1)}", timeout_s=30, connect_timeout_s=5
    )
    try:
        got: list[bytes] = []
        waiter = threading.Thread(target=lambda: got.append(client.get("job/quiet", 60)))
        waiter.start()
        until_watching(cluster.client_ports[0])
        cluster.pause(0)  # silent, its connections open: no end of stream to notice
        writer.set("job/quiet", b"set elsewhere")
        waiter.join(70)
        assert got == [b"set elsewhere"]
        assert client.member != cluster.member_address(0)
        assert client.compare_set("job/quiet", b"set elsewhere", b"swapped") == b"swapped"
    finally:
        client.close()
        writer.close()


class _DropsWrites:
    """A member that answers the status request a client connects with, then closes every
    other request's connection unanswered, as a member that dies mid-request does."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                if head.startswith(b"POST /v3/maintenance/status"):
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                    )

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.sock.close()
        self.thread.join(5)


def test_a_lost_transaction_is_not_repeated_and_a_lost_put_is(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path, 1) as real:
        fake = _DropsWrites()
        address = f"etcd://127.0.0.1:{fake.port},{real.member_address(0)}"
        try:
            with EtcdClient.from_address(
                address, timeout_s=10, connect_timeout_s=5, lease_ttl_s=None
            ) as client:
                assert client.member == f"127.0.0.1:{fake.port}"
                with pytest.raises(StoreError, match="may have been applied"):
                    client.compare_set("k", None, b"v")
                client.set("k", b"put")  # idempotent: sent again to the next member
                assert client.try_get("k") == b"put"
        finally:
            fake.close()
