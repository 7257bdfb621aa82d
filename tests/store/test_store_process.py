"""The job's store as a process of its own (what rank 0 starts): its grace, who keeps it
alive, its start-up answer and the counts rank 0's metrics read. Real processes, real
sockets; every wait polls with a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from processes import gone, until

from cclctl.config import StoreServerConfig
from cclctl.errors import StoreError, StoreTimeout
from cclctl.runtime.job.store_process import DetachedStore, spawn_store
from cclctl.store.client import StoreClient
from cclctl.store.linger import FIRST_RANK_S, Linger, watch

TOKEN = "store-process-token-0123456789abcdefgh"


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., DetachedStore]]:
    """Start store processes; each must be gone by the end of the test (else killed, failed)."""
    started: list[DetachedStore] = []

    def start(linger_s: float, port: int = 0) -> DetachedStore:
        hosting = StoreServerConfig(linger_s=linger_s)
        store = spawn_store("127.0.0.1", port, TOKEN, hosting, job="j", folder=str(tmp_path))
        started.append(store)
        return store

    yield start
    left = [s.pid for s in started if not gone(s.pid)]
    for store in started:
        store.close()
        if not gone(store.pid):
            os.kill(store.pid, signal.SIGKILL)
    assert not left, f"store processes outlived the test: {left}"


def test_with_no_rank_it_exits_after_its_grace_though_readers_stay_connected(
    spawn: Callable[..., DetachedStore],
) -> None:
    store = spawn(0.5)
    with (
        StoreClient(store.host, store.port) as stranger,
        StoreClient(store.host, store.port, token=TOKEN) as reader,  # top with the token
    ):
        assert stranger.list("cclctl/j/status/") == {}
        assert reader.list("cclctl/j/status/") == {}
        until("the store gone", lambda: gone(store.pid), 30)


def test_a_host_agents_connection_does_not_keep_it(spawn: Callable[..., DetachedStore]) -> None:
    """A host agent writes its host's document and reads the dump requests with the token;
    its ranks keep the store, it does not (else no rerun could take the store's port)."""
    store = spawn(0.5)
    with StoreClient(store.host, store.port, token=TOKEN, timeout_s=5) as agent:
        agent.try_get("cclctl/j/signal/dump/count")
        agent.set("cclctl/j/host/node-a", b"{}")
        until("the store gone", lambda: gone(store.pid), 30)


def test_a_host_agents_revoke_fanout_does_not_keep_it(spawn: Callable[..., DetachedStore]) -> None:
    """The agent's revoke fan-out waits on the job's record (a blocking get) and reads it on
    connections of its own; neither is a rank's."""
    store = spawn(0.5)
    with (
        StoreClient(store.host, store.port, token=TOKEN, timeout_s=5) as waits,
        StoreClient(store.host, store.port, token=TOKEN, timeout_s=5) as reads,
    ):
        assert reads.try_get("cclctl/j/revoke") is None
        with pytest.raises(StoreTimeout):
            waits.get("cclctl/j/revoke", timeout_s=0.2)
        until("the store gone", lambda: gone(store.pid), 30)


def test_it_never_exits_while_a_rank_is_connected(spawn: Callable[..., DetachedStore]) -> None:
    store = spawn(0.3)
    with StoreClient(store.host, store.port, token=TOKEN, timeout_s=5) as rank:
        rank.set("cclctl/j/x", b"1")
        # The store answers this wait itself, 10 graces later: it was there all along.
        with pytest.raises(StoreTimeout):
            rank.wait(["cclctl/j/never"], timeout_s=3.0)
        assert not gone(store.pid)
    until("the store gone", lambda: gone(store.pid), 30)  # the last rank left


def test_a_port_in_use_is_an_error_naming_the_address(
    spawn: Callable[..., DetachedStore],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StoreError, match=f"cannot start the store on 127.0.0.1:{port}: "):
            spawn(5.0, port)


def test_the_token_is_not_on_its_command_line_and_it_holds_no_terminal_or_pipe(
    spawn: Callable[..., DetachedStore],
) -> None:
    store = spawn(0.3)
    cmdline = Path(f"/proc/{store.pid}/cmdline").read_bytes()
    assert b"cclctl.store.detached" in cmdline and TOKEN.encode() not in cmdline
    stdio = [os.readlink(f"/proc/{store.pid}/fd/{fd}") for fd in (0, 1)]
    assert stdio == [os.devnull, os.devnull]
    assert os.getsid(store.pid) != os.getsid(0)  # a session of its own
    until("the store gone", lambda: gone(store.pid), 30)


def test_rank0_reads_what_the_store_turned_away(spawn: Callable[..., DetachedStore]) -> None:
    store = spawn(5.0)
    with StoreClient(store.host, store.port, token=TOKEN) as rank:
        rank.set("cclctl/j/held", b"1")  # a rank keeps it alive
        with StoreClient(store.host, store.port) as stranger, pytest.raises(StoreError):
            stranger.set("cclctl/j/status/0", b"forged")
        until("the refusal counted", lambda: store.counts().refused == 1, 30)
        assert store.rejected["bad_proof"] == 0 and store.refused == 1
    os.kill(store.pid, signal.SIGTERM)
    until("the store gone", lambda: gone(store.pid), 30)


def test_the_grace_is_read_from_the_environment_and_checked() -> None:
    from cclctl.config import store_server_from_env
    from cclctl.errors import ConfigError

    assert store_server_from_env({}).linger_s == 120.0
    assert store_server_from_env({"CCLCTL_STORE_LINGER": "2.5"}).linger_s == 2.5
    for bad in ("0", "-1", "soon", "1e9"):
        with pytest.raises(ConfigError, match="CCLCTL_STORE_LINGER="):
            store_server_from_env({"CCLCTL_STORE_LINGER": bad})


class _Watched:
    """What :func:`linger.watch` reads of a store, on a clock the test moves (seconds)."""

    def __init__(self, members_at: dict[float, int]) -> None:
        self.clock = 0.0
        self.members_at = members_at  # from this time on, this many ranks are connected
        self.member_left = 0.0
        self.stopped_at: float | None = None

    def now(self) -> float:
        self.clock += 5.0
        return self.clock

    @property
    def members(self) -> int:
        times = [t for t in self.members_at if t <= self.clock]
        count = self.members_at[max(times)] if times else 0
        if not count and times and not self.member_left:
            self.member_left = max(times)  # the rank left at that time
        return count

    def stop_serving(self) -> None:
        self.stopped_at = self.clock


@pytest.mark.parametrize(
    ("members_at", "stops_at"),
    [
        ({}, FIRST_RANK_S + 5),  # no rank came: the first rank's wait, not the 1 s grace
        ({20.0: 1, 40.0: 0}, 45.0),  # a rank came and left at 40: the grace after it
    ],
)
def test_a_store_waits_for_its_first_rank_then_lingers_its_grace(
    members_at: dict[float, int], stops_at: float
) -> None:
    """A launcher's store starts before its ranks, which a loaded machine starts slowly: it
    waits at least ``first_rank_s`` for the first one (a grace of 1 s once ended it at 5 s
    here, and the ranks that came then found no store); once ranks came and left, the
    grace. (Without ``first_rank_s``, a store no rank came to leaves after its grace:
    ``test_with_no_rank_it_exits_after_its_grace_though_readers_stay_connected``.)"""
    store = _Watched(members_at)
    asyncio.run(watch(store, Linger(1.0, first_rank_s=FIRST_RANK_S)))  # type: ignore[arg-type]
    assert store.stopped_at == stops_at
