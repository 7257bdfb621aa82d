"""What one client may cost the store: each test is an attack on a real socket.

A frame declared huge and sent in part, a flood of idle connections, half frames held open,
a frame declaring a million fields: each is refused or closed by a limit, counted on the
server, and a real client is still served.
"""

from __future__ import annotations

import json
import logging
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest
from store_attacks import (
    closed_by_peer,
    connect,
    declared_frame_head,
    send_until_closed,
    wait_until,
)

from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.frames import FrameReader
from cclctl.store.limits import StoreLimits
from cclctl.store.protocol import REQUEST_HEADER, Op, pack_request
from scripts import script

MiB = 1 << 20
TOKEN = "limits-test-token"


class StoreProcess:
    """A store in a subprocess (tests/support/store_process.py): its port, RSS and counters."""

    def __init__(self, token: str, max_frame: int, max_buffered: int, frame_timeout_s: float):
        args = [token, str(max_frame), str(max_buffered), str(frame_timeout_s)]
        self.proc = subprocess.Popen(
            [sys.executable, script("store_process.py"), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.port, self.ps = int(info["port"]), psutil.Process(info["pid"])

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def counters(self) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def fds() -> Iterator[None]:
    """Enough file descriptors for a few thousand sockets in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if want < 4096:
        pytest.skip(f"needs 4,096 file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def served(port: int, token: str | None = TOKEN) -> bool:
    """A real client connects (proving the token), writes and reads back."""
    with StoreClient("127.0.0.1", port, timeout_s=10, connect_timeout_s=10, token=token) as c:
        c.set("probe", b"ok")
        return c.get("probe") == b"ok"


@pytest.mark.timeout(120)
def test_three_600_mib_half_frames_are_refused_at_the_header_and_cost_no_memory() -> None:
    """Bound: the store's RSS grows by less than 32 MiB (it held 1.8 GB before the cap)."""
    store = StoreProcess("-", 64 * MiB, 0, 30.0)  # an open store: the cap applies to all
    try:
        before = store.rss()
        attackers = [connect(store.port) for _ in range(3)]
        for sock in attackers:
            send_until_closed(sock, declared_frame_head(600 * MiB), 300 * MiB)
        assert all(closed_by_peer(sock) for sock in attackers)
        assert wait_until(lambda: store.counters()["rejected"]["frame_too_large"] == 3)  # type: ignore[index]
        assert store.rss() - before < 32 * MiB
        assert served(store.port, token=None)
        for sock in attackers:
            sock.close()
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_partial_frames_under_the_cap_are_bounded_by_the_buffer_budget() -> None:
    """Three 7 MiB parts of 8 MiB frames with 16 MiB for all partial frames: the third
    connection is closed ("memory") and RSS grows by less than the budget plus 16 MiB."""
    store = StoreProcess("-", 8 * MiB, 16 * MiB, 60.0)
    try:
        before = store.rss()
        attackers = [connect(store.port) for _ in range(3)]
        for sock in attackers:
            send_until_closed(sock, declared_frame_head(8 * MiB - 64), 7 * MiB)
        assert wait_until(lambda: store.counters()["rejected"]["memory"] == 1)  # type: ignore[index]
        assert store.rss() - before < 32 * MiB
        assert served(store.port, token=None)
        for sock in attackers:
            sock.close()
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_eleven_hundred_idle_connections_cannot_crowd_out_the_job(fds: None, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cclctl.store")
    limits = StoreLimits(max_connections=1000)
    with StoreServer(token=TOKEN, limits=limits) as server:
        rank = StoreClient("127.0.0.1", server.port, timeout_s=10, token=TOKEN)  # joined first
        idle = [connect(server.port) for _ in range(1100)]
        assert wait_until(lambda: server.rejected["evicted"] == 101), server.rejected  # 1,101
        assert server.connections == 1000
        assert served(server.port)  # a newcomer evicts the oldest stranger, then leaves
        assert wait_until(lambda: server.connections == 999)
        more = [connect(server.port) for _ in range(200)]
        assert wait_until(lambda: server.rejected["evicted"] == 102 + 199), server.rejected
        assert server.connections == 1000
        rank.set("still", b"here")  # never evicted: it proved the token
        assert rank.get("still") == b"here"
        rank.close()
        for sock in idle + more:
            sock.close()
    assert not [r for r in caplog.records if r.exc_info]  # one line each, no traceback


@pytest.mark.timeout(60)
def test_fifty_half_frames_are_closed_by_the_frame_deadline() -> None:
    with StoreServer(limits=StoreLimits(frame_timeout_s=0.5)) as server:
        halves = [connect(server.port) for _ in range(50)]
        frame = pack_request(Op.SET, [b"key", b"v" * 4096])
        for sock in halves:
            sock.sendall(frame[: len(frame) // 2])
        drip = connect(server.port)  # one byte at a time never renews a frame's deadline
        for byte in frame[:40]:
            drip.sendall(bytes([byte]))
            if server.rejected["frame_timeout"]:
                break
        assert all(closed_by_peer(sock) for sock in halves)
        assert closed_by_peer(drip)
        assert server.rejected["frame_timeout"] == 51
        assert served(server.port, token=None)
        for sock in [*halves, drip]:
            sock.close()


@pytest.mark.timeout(60)
def test_a_stranger_that_says_nothing_is_closed_and_a_quiet_rank_is_not() -> None:
    with StoreServer(token=TOKEN, limits=StoreLimits(idle_timeout_s=0.3)) as server:
        rank = StoreClient("127.0.0.1", server.port, timeout_s=10, token=TOKEN)
        stranger = connect(server.port)  # connected after the rank went quiet
        assert closed_by_peer(stranger)
        assert server.rejected["idle"] == 1
        rank.set("quiet", b"but here")  # idle longer than the stranger, still served
        assert rank.get("quiet") == b"but here"
        rank.close()
        stranger.close()


@pytest.mark.timeout(60)
def test_a_million_field_frame_is_parsed_once_and_others_are_served(monkeypatch) -> None:
    parsed: list[int] = []
    read_lengths = FrameReader._read_lengths

    def counting(self: FrameReader) -> None:
        assert self._header is not None
        parsed.append(self._header[2])  # the field count of the table being read
        read_lengths(self)

    monkeypatch.setattr(FrameReader, "_read_lengths", counting)
    count = 1 << 20
    frame = REQUEST_HEADER.pack(Op.PING, -1.0, count) + bytes(4 * count)  # every field empty
    with StoreServer() as server, StoreClient("127.0.0.1", server.port, timeout_s=10) as client:
        client.set("warm", b"1")  # the idle round trip, for comparison: served
        big = connect(server.port)
        for start in range(0, len(frame), 16384):  # 256 chunks, each once a length check
            big.sendall(frame[start : start + 16384])
            if start % (1 << 20) == 0:
                assert client.get("warm") == b"1"  # a real client is served meanwhile
        big.settimeout(20)
        assert big.recv(5)[:1] == b"\x00"  # the PING's OK, once the frame is whole
        assert parsed.count(count) == 1  # its field table was read once, not per chunk
        big.close()


@pytest.mark.timeout(60)
def test_a_client_without_the_token_may_not_send_big_frames() -> None:
    with StoreServer(token=TOKEN) as server:
        stranger = connect(server.port)
        send_until_closed(stranger, declared_frame_head(1 * MiB, Op.LIST), 1 * MiB)
        assert closed_by_peer(stranger)
        assert server.rejected["frame_too_large"] == 1
        stranger.close()
        assert served(server.port)


def test_store_max_frame_is_validated_and_reaches_the_launchers_store() -> None:
    from cclctl.config import store_server_from_env
    from cclctl.errors import ConfigError

    assert store_server_from_env({"CCLCTL_STORE_MAX_FRAME": "8M"}).max_frame == 8 * MiB
    assert store_server_from_env({}).max_frame == 64 * MiB
    for bad in ("2G", "1K", "lots"):
        with pytest.raises(ConfigError, match="CCLCTL_STORE_MAX_FRAME"):
            store_server_from_env({"CCLCTL_STORE_MAX_FRAME": bad})
    with pytest.raises(ConfigError, match="CCLCTL_STORE_ADDR"):
        store_server_from_env({"CCLCTL_STORE_ADDR": "host:80"})
    assert socket.AF_INET  # the module's socket import is used above for connections
