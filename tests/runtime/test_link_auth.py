"""Nobody gets in: a TCP link is kept only after both ranks prove they hold the job's token.

The attack these tests replay worked against the unauthenticated links: read rank 1's
address from the store, connect first claiming rank 0, echo forged payloads. Now it is
refused, counted and named in rank 1's log, and the job's results stay exact.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from launch_helpers import Lines
from thread_ranks import run_comms

from cclctl import auth
from cclctl.config import RuntimeConfig, job_dir
from cclctl.errors import PeerError, ProtocolError
from cclctl.launch.launcher import launch
from cclctl.runtime.comm.communicator import Communicator, world_comm_id
from cclctl.runtime.job.fanin_meeting import published_address
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp import link_auth
from cclctl.runtime.transport.tcp.link_auth import HandshakeRefused
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.transport import TcpTransport
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore
from scripts import script

WORKER = script("link_auth_worker.py")
TOKEN = "the-job-token-for-these-tests-0123456789"
JOB = "links-test"
CALL = wire.Call(comm=wire.comm_tag("0:0-1"), epoch=0, seq=1, op="all_reduce")


def _until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(0.01)


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other side closes the connection (rather than talk to us)."""
    sock.settimeout(15.0)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _old_attack(host: str, port: int, job: str) -> bool:
    """The attack that worked: the old hello as rank 0, then a forged all_reduce message."""
    with socket.create_connection((host, port), timeout=10) as sock:
        hello = struct.pack("<4sIII", b"CCL1", zlib.crc32(job.encode()), 0, 2)
        forged = np.full(2, 1000.0, dtype=np.float32).tobytes()
        sock.sendall(hello + wire.pack(CALL, 0, len(forged)) + forged)
        return _closed_by_peer(sock)


def _forged_attack(host: str, port: int, job: str) -> str:
    """The new handshake as rank 0, with a token the attacker guessed."""
    with socket.create_connection((host, port), timeout=10) as sock:
        try:
            link_auth.connect(sock, "a-guessed-token", job, 0, 0, 1, 2, 0)
        except (HandshakeRefused, OSError) as exc:
            return str(exc)
    return "accepted"


def test_an_attacker_who_knows_the_address_and_connects_first_is_refused() -> None:
    """Rank 0 holds back until the attacker tried twice; rank 1 refuses both, then links
    the real rank 0, and all 5 all_reduces give 3 on both ranks.

    The store no longer answers a stranger (tests/store/test_store_auth.py), so the test
    reads rank 1's address with the job's token from its folder, as an operator would; the
    attack on the link itself holds no token.
    """
    outcome: dict[str, Any] = {}

    def attack(store_address: str, job: str) -> None:
        def run() -> None:
            try:
                token = auth.read_token_file(job_dir(job))
                client = StoreClient.from_address(store_address, connect_timeout_s=10, token=token)
                # what rank 1 published for its transport (it joined through its host agent)
                scoped = ScopedStore.for_job(client, job)
                host, _, port = published_address(scoped, 1, 2, 30).rpartition(":")
                outcome["old"] = _old_attack(host, int(port), job)
                outcome["forged"] = _forged_attack(host, int(port), job)
                client.set("test/attacked", b"1")
                client.close()
            except BaseException as exc:  # the test reads it below
                outcome["error"] = exc

        threading.Thread(target=run, daemon=True).start()

    lines = Lines()
    env = {"CCLCTL_TRANSPORT": "tcp", "LINK_TEST_HOLD": "1", "CCLCTL_JOB": "victim"}
    result = launch(
        [sys.executable, WORKER], 2, env=env, output=lines, on_start=attack, timeout_s=90
    )
    assert "error" not in outcome, outcome
    assert result.returncode == 0, lines.items
    assert outcome["old"] is True
    assert "refused" in outcome["forged"], outcome
    reports = {
        json.loads(line)["rank"]: json.loads(line)
        for _, stream, line in lines.items
        if stream == "stdout"
    }
    for rank in (0, 1):
        assert reports[rank]["results"] == [[3.0] * 4] * 5
    assert reports[1]["refused"] == 2 and reports[0]["refused"] == 0
    log = [line for rank, stream, line in lines.items if rank == 1 and stream == "stderr"]
    refusals = [line for line in log if "refused a link from 127.0.0.1:" in line]
    assert len(refusals) == 2, log  # in either order: each handshake has a thread
    assert any("claiming rank 0: an unauthenticated (CCL1) handshake" in r for r in refusals)
    assert any("claiming rank 0: bad proof" in r for r in refusals), refusals


# -- thread ranks over real sockets ------------------------------------------------------


def _Wait(timeout_s: float = 10.0) -> Wait:
    """A step's wait with a plain deadline, for calling Links directly."""
    return Wait(rank=0, deadline=time.monotonic() + timeout_s)


@pytest.fixture
def pair() -> Iterator[Callable[..., tuple[Links, Links]]]:
    made: list[Links] = []

    def make(token0: str = TOKEN, token1: str = TOKEN, **kw: Any) -> tuple[Links, Links]:
        links = (
            Links(0, 2, JOB, "127.0.0.1", 10.0, token=token0, **kw),
            Links(1, 2, JOB, "127.0.0.1", 10.0, token=token1, **kw),
        )
        for one in links:
            one.peers = [links[0].address, links[1].address]
        made.extend(links)
        return links

    yield make
    for one in made:
        one.close()


def _link(a: Links, b: Links) -> tuple[socket.socket, socket.socket]:
    """Link rank 0 (``a``) to rank 1 (``b``) as a step would: connect, and accept."""
    accepted: dict[str, socket.socket] = {}
    thread = threading.Thread(target=lambda: accepted.update(s=b.get(0, CALL, _Wait())))
    thread.start()
    sock = a.get(1, CALL, _Wait())
    thread.join(10)
    return sock, accepted["s"]


def _address(links: Links) -> tuple[str, int]:
    host, _, port = links.address.rpartition(":")
    return host, int(port)


def test_a_wrong_token_is_refused_on_both_sides(pair: Callable[..., tuple[Links, Links]]) -> None:
    a, b = pair(token1="another-token-entirely-0123456789")
    with pytest.raises(PeerError, match=r"link handshake with rank 1 .* failed: it refused"):
        a.get(1, CALL, _Wait())
    _until(lambda: b.auth_failures == 1)
    assert 0 not in b.socks and 1 not in a.socks


def test_the_real_peer_links_past_a_silent_stranger_a_stranger_who_sends_garbage_and_a_second_claim(
    pair: Callable[..., tuple[Links, Links]], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = pair(handshake_timeout_s=0.5)
    silent = socket.create_connection(_address(b))  # says nothing: dropped at the deadline
    with socket.create_connection(_address(b)) as garbage:
        garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert _closed_by_peer(garbage)
    sock0, sock1 = _link(a, b)
    payload = b"x" * 10
    sock0.setblocking(True)
    sock0.sendall(payload)
    sock1.setblocking(True)
    assert sock1.recv(10) == payload  # the proven link is the one filed under rank 0
    again = socket.create_connection(_address(b))  # the token, but rank 0 is linked
    with again, pytest.raises(HandshakeRefused):
        link_auth.connect(again, TOKEN, JOB, 0, 0, 1, 2, 0)
    assert _closed_by_peer(silent)
    silent.close()
    _until(lambda: b.auth_failures == 3)
    reasons = [r.getMessage() for r in caplog.records if r.name == "cclctl.links"]
    assert any("claiming rank ?: not a cclctl link handshake" in r for r in reasons), reasons
    assert any("claiming rank ?: no complete handshake before the deadline" in r for r in reasons)
    assert any("claiming rank 0: that rank is already linked" in r for r in reasons)


@pytest.mark.parametrize(
    ("hello", "why"),
    [
        (dict(job="another-job"), "another job"),
        (dict(world=3), "meant for rank 1 of 3"),
        (dict(rank=1), "a rank that does not connect to this one"),
        (dict(epoch=1), "epoch 1"),
        (dict(flags=link_auth.FLAG_MAC), "CCLCTL_LINK_MAC differs"),
    ],
)
def test_a_hello_for_another_job_world_rank_epoch_or_mac_setting_is_refused(
    pair: Callable[..., tuple[Links, Links]],
    caplog: pytest.LogCaptureFixture,
    hello: dict[str, Any],
    why: str,
) -> None:
    _, b = pair()
    args = dict(job=JOB, epoch=0, rank=0, world=2, flags=0) | hello
    with socket.create_connection(_address(b)) as sock, pytest.raises(HandshakeRefused):
        link_auth.connect(
            sock, TOKEN, args["job"], args["epoch"], args["rank"], 1, args["world"],
            args["flags"],
        )  # fmt: skip
    _until(lambda: b.auth_failures == 1)
    assert any(why in r.getMessage() for r in caplog.records if r.name == "cclctl.links")


def test_links_refuse_to_open_without_a_token() -> None:
    with pytest.raises(Exception, match="no token"):
        Links(0, 2, JOB, "127.0.0.1", 1.0, token="")


# -- the MAC catches a byte flipped in flight -------------------------------------------

#: Where the proxy flips a byte in rank 0's stream: past the handshake (HELLO and PROOF),
#: the first message's header, and 5 bytes into its payload.
FLIP_AT = 48 + 36 + wire.HEADER_SIZE + 5


class FlippingProxy:
    """A TCP relay in front of rank 1 that flips one byte of what rank 0 sends it."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.flipped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        upstream = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
        self._pump(upstream, client, False)

    def _pump(self, src: socket.socket, dst: socket.socket, flip: bool) -> None:
        offset = 0
        try:
            while data := src.recv(65536):
                if flip and offset <= FLIP_AT < offset + len(data):
                    chunk = bytearray(data)
                    chunk[FLIP_AT - offset] ^= 0x40
                    data = bytes(chunk)
                    self.flipped.set()
                offset += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):  # shutdown first: it wakes the other pump's recv, and sends
                with contextlib.suppress(OSError):  # the FIN a close from here would not
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self.listener.close()


def _comms(links: list[Links], cfg: RuntimeConfig) -> list[Communicator]:
    n = len(links)
    return [
        Communicator(
            rank=r, world_size=n, transport=TcpTransport(one), cfg=cfg, comm_id=world_comm_id(n)
        )
        for r, one in enumerate(links)
    ]


def _proxied_all_reduce(mac: bool) -> tuple[list[Any], FlippingProxy]:
    """All_reduce of ``rank + 1`` on two thread ranks, rank 0 reaching rank 1 through the
    proxy; each rank's result or error."""
    cfg = RuntimeConfig(job=JOB, timeout_s=20.0, connect_timeout_s=10.0, token=TOKEN)
    links = [Links(r, 2, JOB, "127.0.0.1", 10.0, token=TOKEN, mac=mac) for r in range(2)]
    proxy = FlippingProxy(links[1].address)
    links[0].peers = [links[0].address, proxy.address]
    links[1].peers = [links[0].address, links[1].address]
    comms = _comms(links, cfg)
    out: list[Any] = [None, None]

    def body(r: int) -> None:
        x = np.full(1024, r + 1, dtype=np.float32)
        try:
            comms[r].all_reduce(x)
            out[r] = x
        except Exception as exc:
            out[r] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in comms:
        c.close()
    proxy.close()
    return out, proxy


def test_the_mac_catches_a_payload_byte_flipped_in_flight() -> None:
    out, proxy = _proxied_all_reduce(mac=True)
    assert proxy.flipped.is_set()
    assert isinstance(out[1], ProtocolError), out
    assert "from rank 0 failed its integrity check" in str(out[1])
    assert out[1].fields["peer"] == 0


def test_without_the_mac_the_same_flip_goes_unnoticed() -> None:
    """The control: the proxy really changes the data, and only the MAC tells."""
    out, proxy = _proxied_all_reduce(mac=False)
    assert proxy.flipped.is_set()
    assert all(isinstance(x, np.ndarray) for x in out), out
    assert not all(np.array_equal(x, np.full(1024, 3.0, np.float32)) for x in out)


def test_mac_links_give_exact_results() -> None:
    cfg = RuntimeConfig(job=JOB, timeout_s=20.0, connect_timeout_s=10.0, token=TOKEN)
    links = [Links(r, 3, JOB, "127.0.0.1", 10.0, token=TOKEN, mac=True) for r in range(3)]
    for one in links:
        one.peers = [x.address for x in links]
    comms = _comms(links, cfg)

    def body(comm: Communicator) -> list[float]:
        sums = []
        for size in (1, 1000, 300_000):
            x = np.full(size, comm.rank + 1, dtype=np.float64)
            comm.all_reduce(x)
            sums.append(float(x.sum()))
        return sums

    assert run_comms(comms, body) == [[6.0, 6000.0, 1_800_000.0]] * 3
