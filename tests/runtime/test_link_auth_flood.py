"""A flood on a rank's port costs the job nothing: connections that prove nothing never
take a real peer's handshake slot, and refusals are logged at a bounded rate, with a count.

The case these replay: 70 silent connections per rank port (past the 64 handshake slots)
before the first call made the real peer's link close at once, blaming the configuration;
with retry off the job died, with retry on each flood cost a retry. And every refused
handshake was a log line: 1,000 lines a second of forging.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from launch_helpers import Lines

from cclctl import auth
from cclctl.config import job_dir
from cclctl.launch.launcher import launch
from cclctl.runtime.job.fanin_meeting import published_address
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp import link_auth
from cclctl.runtime.transport.tcp import links as tcp_links
from cclctl.runtime.transport.tcp.link_auth import HandshakeRefused
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.refusals import RefusalLog
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore
from scripts import script

WORKER = script("link_auth_worker.py")
TOKEN = "the-job-token-for-these-tests-0123456789"
JOB = "flood-test"
SILENT_PER_PORT = 70  # past MAX_PENDING_HANDSHAKES (64)
_CALL = wire.Call(comm=wire.comm_tag("0:0-1"), epoch=0, seq=1, op="all_reduce")


def _wait() -> Wait:
    return Wait(rank=0, deadline=time.monotonic() + 10.0)


def _rank_ports(client: StoreClient, job: str, n: int) -> list[tuple[str, int]]:
    ports = []
    for rank in range(n):
        # what the rank published for its transport (it joined through its host agent)
        address = published_address(ScopedStore.for_job(client, job), rank, n, 30)
        host, _, port = address.rpartition(":")
        ports.append((host, int(port)))
    return ports


def _attack_then_release(
    n: int, attack: Callable[[list[tuple[str, int]]], None], outcome: dict[str, Any]
) -> Callable[[str, str], None]:
    """An ``on_start`` for :func:`launch`: read every rank's port with the job's token (as
    an operator would; the attack itself holds none), ``attack`` them, then let the ranks
    make their first call (the worker holds them until ``test/attacked``)."""

    def on_start(store_address: str, job: str) -> None:
        def run() -> None:
            try:
                token = auth.read_token_file(job_dir(job))
                client = StoreClient.from_address(store_address, connect_timeout_s=10, token=token)
                attack(_rank_ports(client, job, n))
                client.set("test/attacked", b"1")
                client.close()
            except BaseException as exc:  # the test reads it below
                outcome["error"] = exc

        threading.Thread(target=run, daemon=True).start()

    return on_start


def _reports(lines: Lines) -> dict[int, dict[str, Any]]:
    return {
        json.loads(line)["rank"]: json.loads(line)
        for _, stream, line in lines.items
        if stream == "stdout" and line.startswith("{")
    }


def _log(lines: Lines, rank: int) -> list[str]:
    return [line for r, stream, line in lines.items if r == rank and stream == "stderr"]


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("retry", ["off", "on"])
def test_a_job_links_past_silent_connections_on_every_port_without_a_retry(
    n: int, retry: str
) -> None:
    """70 silent connections on every rank's port before the first call: the job gives
    exact results, with retry off it does not fail, with retry on it retries nothing."""
    silent: list[socket.socket] = []
    outcome: dict[str, Any] = {}

    def flood(ports: list[tuple[str, int]]) -> None:
        for port in ports:
            silent.extend(
                socket.create_connection(port, timeout=10) for _ in range(SILENT_PER_PORT)
            )

    env = {"CCLCTL_TRANSPORT": "tcp", "LINK_TEST_HOLD": "1", "CCLCTL_JOB": f"flood{n}{retry}"}
    if retry == "off":
        env["CCLCTL_RETRY_BUDGET"] = "0"
    lines = Lines()
    try:
        on_start = _attack_then_release(n, flood, outcome)
        result = launch(
            [sys.executable, WORKER], n, env=env, output=lines, on_start=on_start, timeout_s=120
        )
    finally:
        for sock in silent:
            sock.close()
    assert "error" not in outcome, outcome
    assert result.returncode == 0, lines.items
    reports = _reports(lines)
    total = float(n * (n + 1) // 2)
    for rank in range(n):
        assert reports[rank]["results"] == [[total] * 4] * 5, reports[rank]
        assert (reports[rank]["retries"], reports[rank]["epoch"]) == (0, 0), reports[rank]
        # each port's flood filled the slots; every newcomer past them took the oldest's
        assert reports[rank]["refused"] >= SILENT_PER_PORT - tcp_links.MAX_PENDING_HANDSHAKES
        told = [line for line in _log(lines, rank) if "handshake slots were taken" in line]
        assert 1 <= len(told) <= 2, _log(lines, rank)  # the first in full, then a count


def _garbage(port: tuple[str, int]) -> None:
    with socket.create_connection(port, timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass


def _wrong_proof(port: tuple[str, int], job: str) -> None:
    with (
        socket.create_connection(port, timeout=10) as sock,
        contextlib.suppress(HandshakeRefused, OSError),
    ):
        link_auth.connect(sock, "a-guessed-token", job, 0, 0, 1, 2, 0)


_FULL = re.compile(r"rank 1: refused a link from 127\.0\.0\.1:\d+ claiming rank [0?]: (.*)")
_COUNT = re.compile(r"rank 1: refused ([\d,]+) more link handshakes in the last \d+ s: (.*?);")


@pytest.mark.slow
def test_forgers_at_a_high_rate_make_a_bounded_number_of_lines_with_a_count() -> None:
    """300 garbage connections and 300 wrong proofs on rank 1's port, four at a time: rank
    1 counts all 600, logs at most two lines per kind, and the lines' counts add up."""
    each = 300
    outcome: dict[str, Any] = {}

    def forge(ports: list[tuple[str, int]]) -> None:
        jobs = [lambda: _garbage(ports[1]), lambda: _wrong_proof(ports[1], "forged")] * 2

        def worker(job: Callable[[], None]) -> None:
            for _ in range(each // 2):
                job()

        threads = [threading.Thread(target=worker, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

    env = {"CCLCTL_TRANSPORT": "tcp", "LINK_TEST_HOLD": "1", "CCLCTL_JOB": "forged"}
    lines = Lines()
    on_start = _attack_then_release(2, forge, outcome)
    result = launch(
        [sys.executable, WORKER], 2, env=env, output=lines, on_start=on_start, timeout_s=120
    )
    assert "error" not in outcome, outcome
    assert result.returncode == 0, lines.items
    reports = _reports(lines)
    assert reports[1]["refused"] == 2 * each and reports[1]["retries"] == 0, reports
    assert reports[0]["results"] == [[3.0] * 4] * 5
    log = [line for line in _log(lines, 1) if "refused" in line]
    assert len(log) <= 4, log  # two kinds: a full line and a count each
    full = [m.group(1) for line in log if (m := _FULL.search(line))]
    counts = [
        (int(m.group(1).replace(",", "")), m.group(2)) for line in log if (m := _COUNT.search(line))
    ]
    assert sum(1 for _ in full) + sum(c for c, _ in counts) == 2 * each, log
    assert {why for _, why in counts} == {
        link_auth.KINDS["not_cclctl"],
        link_auth.KINDS["bad_proof"],
    }, log


# -- thread ranks over real sockets ------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[Links, Links]]:
    links = (
        Links(0, 2, JOB, "127.0.0.1", 10.0, token=TOKEN),
        Links(1, 2, JOB, "127.0.0.1", 10.0, token=TOKEN),
    )
    for one in links:
        one.peers = [links[0].address, links[1].address]
    yield links
    for one in links:
        one.close()


def _port(links: Links) -> tuple[str, int]:
    host, _, port = links.address.rpartition(":")
    return host, int(port)


def _hello(job: str = JOB) -> bytes:
    """A HELLO as rank 0 of 2 would send it to rank 1 (anyone can write one: no secret)."""
    shape = struct.Struct("<4sBBHIIIIQ16s")
    return shape.pack(b"CCL2", 1, 0, 0, zlib.crc32(job.encode()), 0, 1, 2, 0, b"n" * 16)


def _until(predicate: Callable[[], bool]) -> None:
    event = threading.Event()
    for _ in range(1000):
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError("condition not reached")


def test_the_real_peer_links_past_more_silent_connections_than_slots(
    pair: tuple[Links, Links],
) -> None:
    a, b = pair
    silent = [socket.create_connection(_port(b)) for _ in range(SILENT_PER_PORT)]
    try:
        _until(lambda: b.auth_failures == 6)  # all 70 accepted: the slots are full
        accepted: dict[str, socket.socket] = {}
        thread = threading.Thread(target=lambda: accepted.update(s=b.get(0, _CALL, _wait())))
        thread.start()
        a.get(1, _CALL, _wait())
        thread.join(10)
        assert 0 in b.socks and 1 in a.socks
        assert b.refusals.by_kind["evicted"] == 7  # the real peer took the oldest's place
    finally:
        for sock in silent:
            sock.close()


def test_a_connection_dropped_for_a_newer_one_is_told_so(pair: tuple[Links, Links]) -> None:
    """With every slot waiting on a PROOF, a newcomer takes the oldest's place, and that
    one hears why (REFUSE "evicted"), which a real connector takes as: connect again."""
    _, b = pair
    held = [socket.create_connection(_port(b)) for _ in range(tcp_links.MAX_PENDING_HANDSHAKES)]
    try:
        for sock in held:
            sock.sendall(_hello())
            assert sock.recv(4, socket.MSG_WAITALL) == link_auth.CHALLENGE_MAGIC
            sock.recv(16, socket.MSG_WAITALL)
        newcomer = socket.create_connection(_port(b))
        held[0].settimeout(10)
        told = held[0].recv(8, socket.MSG_WAITALL)
        assert told == link_auth.refusal("evicted") and told.startswith(b"CCLr")
        newcomer.close()
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize(
    ("job", "epoch", "said"),
    [("another-job", 0, "it refused the link: another job"), (JOB, 1, "another epoch")],
)
def test_the_connector_hears_why_it_was_refused(
    pair: tuple[Links, Links], job: str, epoch: int, said: str
) -> None:
    """Not "it closed the link at once (another job, world size or CCLCTL_LINK_MAC?)"."""
    _, b = pair
    with socket.create_connection(_port(b)) as sock, pytest.raises(HandshakeRefused) as info:
        link_auth.connect(sock, TOKEN, job, epoch, 0, 1, 2, 0)
    assert said in info.value.why, info.value.why


def test_refusals_are_one_line_per_kind_a_window_and_then_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    refusals = RefusalLog(1, every_s=60.0, clock=lambda: now[0])
    bad = HandshakeRefused("bad proof (it does not hold the job's token)", 0, "bad_proof")
    with caplog.at_level(logging.WARNING, logger="cclctl.links"):
        for i in range(1234):
            now[0] = i * 0.01  # 1,234 in 12.3 s
            refusals.refused(("127.0.0.1", 1000 + i), bad)
        assert len(caplog.records) == 1
        now[0] = 60.0
        refusals.tell_due()
        assert len(caplog.records) == 2
        assert "refused 1,233 more link handshakes in the last 60 s: bad proof" in caplog.text
        assert "the latest from 127.0.0.1:2233 claiming rank 0" in caplog.text
        now[0] = 200.0  # quiet for a window: the next is told in full again
        refusals.tell_due()
        refusals.refused(("127.0.0.1", 9), bad)
        refusals.close()
    assert len(caplog.records) == 3 and refusals.total == 1235
    assert refusals.by_kind == {"bad_proof": 1235}


class _BusyOnce:
    """A port in front of rank 1 that turns the first connection away for want of a slot,
    as a flooded acceptor does, and relays every later one to rank 1."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                self.connections += 1
                if self.connections == 1:
                    client.recv(48, socket.MSG_WAITALL)  # its HELLO, then no slot for it
                    client.sendall(link_auth.refusal("evicted"))
                    client.close()
                    continue
                upstream = socket.create_connection(self.target)
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def test_a_connector_turned_away_for_want_of_a_slot_connects_again(
    pair: tuple[Links, Links],
) -> None:
    a, b = pair
    busy = _BusyOnce(_port(b))
    a.peers = [a.address, busy.address]
    try:
        accepted: dict[str, socket.socket] = {}
        thread = threading.Thread(target=lambda: accepted.update(s=b.get(0, _CALL, _wait())))
        thread.start()
        a.get(1, _CALL, _wait())
        thread.join(10)
        assert busy.connections == 2 and 1 in a.socks and "s" in accepted
    finally:
        busy.close()
