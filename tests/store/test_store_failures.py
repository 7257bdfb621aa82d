"""The store when things go wrong: timeouts, an unreachable or vanished store, bad bytes."""

from __future__ import annotations

import os
import select
import socket
import threading

import pytest
from ports import free_port
from store_waits import until_waiting

from cclctl.errors import StoreError, StoreTimeout
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.protocol import REPLY_HEADER, Status


@pytest.mark.timeout(10)
def test_get_timeout_names_the_key_and_the_store(client: StoreClient, server: StoreServer) -> None:
    with pytest.raises(StoreTimeout) as info:
        client.get("rank/7/addr", timeout_s=0.3)
    assert str(info.value) == (
        f"timed out after 0.3s waiting for key 'rank/7/addr' in the store at {server.address}"
    )
    assert info.value.fields["key"] == "rank/7/addr"
    client.set("after", b"1")  # a timeout does not break the connection
    assert client.get("after") == b"1"


@pytest.mark.timeout(10)
def test_wait_timeout_names_only_the_missing_keys(client: StoreClient, server: StoreServer) -> None:
    client.set("b", b"1")
    with pytest.raises(StoreTimeout) as info:
        client.wait(["a", "b", "c"], timeout_s=0.2)
    assert str(info.value) == (
        f"timed out after 0.2s waiting for keys 'a', 'c' in the store at {server.address}"
    )
    client.wait(["b"], timeout_s=0.2)  # present keys return at once


@pytest.mark.timeout(10)
def test_unreachable_store_is_a_timeout_naming_the_address() -> None:
    port = free_port()
    with pytest.raises(StoreTimeout) as info:
        StoreClient("127.0.0.1", port, connect_timeout_s=0.4)
    assert str(info.value) == (
        f"cannot reach the store at 127.0.0.1:{port} after 0.4s: Connection refused"
    )


@pytest.mark.timeout(10)
def test_client_keeps_retrying_until_the_store_comes_up() -> None:
    port = free_port()
    late = StoreServer("127.0.0.1", port)
    timer = threading.Timer(0.4, late.start)
    timer.start()
    try:
        with StoreClient("127.0.0.1", port, connect_timeout_s=5) as c:
            c.set("k", b"v")
            assert c.get("k") == b"v"
    finally:
        timer.join()
        late.close()


@pytest.mark.timeout(10)
def test_port_in_use_names_host_and_port(server: StoreServer) -> None:
    with pytest.raises(StoreError) as info:
        StoreServer("127.0.0.1", server.port).start()
    assert str(info.value) == (
        f"cannot start the store on 127.0.0.1:{server.port}: Address already in use"
    )


@pytest.mark.timeout(10)
def test_closing_the_server_fails_a_blocked_get_with_the_address() -> None:
    srv = StoreServer().start()
    c = StoreClient("127.0.0.1", srv.port, connect_timeout_s=5)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            c.get("never", timeout_s=30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    until_waiting(srv, "never")
    srv.close()
    t.join(5)
    assert not t.is_alive()
    assert isinstance(errors[0], StoreError) and not isinstance(errors[0], StoreTimeout)
    assert str(errors[0]).startswith(f"lost the connection to the store at {srv.address}: ")
    with pytest.raises(StoreError, match="is closed"):
        c.set("k", b"v")
    c.close()


@pytest.mark.timeout(10)
def test_closing_a_client_unblocks_its_waiting_thread(
    client: StoreClient, server: StoreServer
) -> None:
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            client.get("never", timeout_s=30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    until_waiting(server, "never")
    client.close()
    t.join(5)
    assert not t.is_alive()
    assert "is closed" in str(errors[0])


@pytest.mark.timeout(10)
def test_garbage_on_the_wire_is_refused_and_the_server_keeps_serving(
    server: StoreServer, client: StoreClient
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"\x07" + b"\xff" * 20)  # an absurd field count
        reply = raw.recv(4096)
        status, _ = REPLY_HEADER.unpack_from(reply)
        assert status == Status.ERROR and b"not a store request" in reply
        assert raw.recv(4096) == b""  # and the server hung up
    client.set("k", b"v")
    assert client.get("k") == b"v"


@pytest.mark.timeout(20)
def test_a_forked_process_neither_talks_on_nor_cuts_the_parents_connection(
    client: StoreClient,
) -> None:
    """A fork inherits the socket: a request from it would interleave with the parent's on
    one stream, and a shutdown would cut the parent off. It gets a clear error instead, and
    its close leaves the parent's connection working."""
    client.set("before", b"1")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one request, then close, then report
        verdict = b"no error"
        try:
            client.set("from-child", b"x")
        except StoreError as exc:
            verdict = b"refused" if "forked" in str(exc) else b"other error"
        except BaseException:
            verdict = b"other error"
        finally:
            try:
                client.close()
                os.write(write_end, verdict)
            finally:
                os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 10)
        assert ready and os.read(read_end, 16) == b"refused"
    finally:
        os.waitpid(pid, 0)
        os.close(read_end)
    assert client.try_get("from-child") is None
    client.set("after", b"2")
    assert client.get("before") == b"1" and client.get("after") == b"2"
