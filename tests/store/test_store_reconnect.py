"""A store client heals after its connection is reset, and never repeats what it must not.

The reset is a real one: ``ss -K`` (iproute2, as root) destroys the client's socket, as a
conntrack flush or a middlebox timeout would. The not-idempotent case needs a store that
takes a request and hangs up before answering, so a small fake one plays it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from cclctl.errors import StoreError
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.frames import FrameReader
from cclctl.store.protocol import MAX_FIELDS, Status, pack_reply

needs_ss = pytest.mark.skipif(
    shutil.which("ss") is None or os.geteuid() != 0,
    reason="killing a socket needs iproute2's ss and root (scripts/test installs it)",
)


def kill_connection(store_port: int, local_port: int) -> None:
    """Destroy the client's end of one store connection, as ``ss -K`` does to a live one."""
    cmd = ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{store_port}"]
    out = subprocess.run([*cmd, "sport", "=", f":{local_port}"], capture_output=True, text=True)
    assert f":{local_port}" in out.stdout, out  # ss lists each socket it destroyed


@needs_ss
def test_a_reset_connection_is_reopened_on_the_next_request() -> None:
    with StoreServer() as srv, StoreClient(srv.host, srv.port, connect_timeout_s=5) as client:
        client.set("status/0", b"first")
        assert client._sock is not None
        kill_connection(srv.port, client._sock.getsockname()[1])
        client.set("status/0", b"second")  # the reset is found on sending: sent again
        assert (client.reconnects, client.try_get("status/0")) == (1, b"second")
        assert client._sock is not None
        kill_connection(srv.port, client._sock.getsockname()[1])
        # an add that never left is safe to send on the new connection, and counts once
        assert client.add("count", 1) == 1
        assert (client.reconnects, client.add("count", 0)) == (2, 1)


class HangUpOnce:
    """A fake store: the first connection takes one request and closes unanswered; later
    connections answer every request OK. ``requests`` counts every request received."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        for index in range(2):
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed by a test that needed fewer connections
            with conn:
                self._answer(conn, answer=index > 0)

    def _answer(self, conn: socket.socket, answer: bool) -> None:
        frames = FrameReader(max_frame=1 << 20, max_fields=MAX_FIELDS)
        while data := conn.recv(65536):
            frames.feed(data)
            while frames.take() is not None:
                self.requests += 1
                if not answer:
                    return  # hang up with the request taken, as a store that died would
                conn.sendall(pack_reply(Status.OK, [b"7"]))

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def hang_up_once() -> Iterator[HangUpOnce]:
    fake = HangUpOnce()
    try:
        yield fake
    finally:
        fake.close()


def test_an_add_lost_after_it_left_is_not_sent_again(hang_up_once: HangUpOnce) -> None:
    client = StoreClient("127.0.0.1", hang_up_once.port, timeout_s=5, connect_timeout_s=5)
    with client, pytest.raises(StoreError) as lost:
        client.add("count", 1)
    assert "the add may have been applied, so it is not repeated" in str(lost.value)
    assert hang_up_once.requests == 1


def test_a_set_lost_after_it_left_is_sent_again(hang_up_once: HangUpOnce) -> None:
    with StoreClient("127.0.0.1", hang_up_once.port, timeout_s=5, connect_timeout_s=5) as client:
        client.set("status/0", b"doc")  # taken, unanswered, then sent on a new connection
        assert (hang_up_once.requests, client.reconnects) == (2, 1)


def test_a_closed_client_does_not_reconnect() -> None:
    with StoreServer() as srv:
        client = StoreClient(srv.host, srv.port, connect_timeout_s=5)
        client.close()
        with pytest.raises(StoreError, match="is closed"):
            client.set("k", b"v")
        assert client.reconnects == 0
