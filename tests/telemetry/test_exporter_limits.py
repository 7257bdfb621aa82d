"""The exporter under a slow-request flood: one thread, bounded sockets, a real scrape served.

A thousand half-sent requests used to leave a thread each in the rank; now they cost at most
the exporter's connection cap, each is dropped at its deadline or to make room, and a real
scrape still gets its metrics.
"""

from __future__ import annotations

import resource
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from ports import free_port

from cclctl.telemetry.http_serve import MetricsHTTPServer

HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: rank0\r\n"  # no blank line: never ends


@pytest.fixture
def fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if want < 2200:
        pytest.skip(f"needs 2,200 file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def wait_until(check, within_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def closed_by_peer(sock: socket.socket, within_s: float = 10.0) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


@pytest.mark.timeout(120)
def test_a_thousand_half_sent_requests_leave_the_thread_count_alone(make_tel, fds) -> None:
    port = free_port()
    tel = make_tel(metrics_port=port)
    url = tel.serve_metrics()
    assert url is not None
    threads = threading.active_count()
    server = tel.services.exporter.server
    assert server is not None
    flood = []
    try:
        for _ in range(1000):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(HALF_REQUEST)
            flood.append(sock)
        assert wait_until(lambda: server.rejected["evicted"] >= 1000 - server.max_connections)
        assert threading.active_count() == threads  # no thread per request
        with urllib.request.urlopen(url, timeout=10) as reply:  # a real scrape gets in
            assert reply.status == 200 and b"cclctl_info" in reply.read()
        assert threading.active_count() == threads
    finally:
        for sock in flood:
            sock.close()
        tel.close()


@pytest.mark.timeout(60)
def test_a_half_sent_request_is_closed_at_its_deadline() -> None:
    server = MetricsHTTPServer(lambda: b"m 1\n", "text/plain", request_timeout_s=0.3)
    port = server.start("127.0.0.1", 0)
    try:
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow.sendall(HALF_REQUEST)
        assert closed_by_peer(slow)
        assert server.rejected["timeout"] == 1
        slow.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.read() == b"m 1\n"
    finally:
        server.stop()


@pytest.mark.timeout(30)
def test_other_paths_and_methods_are_refused_plainly() -> None:
    server = MetricsHTTPServer(lambda: b"m 1\n", "text/plain")
    port = server.start("127.0.0.1", 0)
    try:
        for request, status in (
            (b"GET /nope HTTP/1.1\r\n\r\n", b"404"),
            (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
            (b"garbage\r\n\r\n", b"400"),
            (b"GET /" + b"x" * 9000, b"431"),
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(request)
                assert sock.recv(64).split(b" ")[1] == status
    finally:
        server.stop()
