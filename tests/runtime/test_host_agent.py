"""The host agent: ranks' statuses reach the store as one document per host, and a rank
whose agent is gone publishes its own, without stopping.

In this process: :class:`HostAgent` on a real abstract socket with ranks'
:class:`AgentRoute`'s, and the readers' merge of host documents with ranks' own keys. With
real processes: a launched job publishes through its agent, and goes on when it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from live_job import live_job

from cclctl import host_status
from cclctl.diagnose_io.live import diagnose_live
from cclctl.errors import BadInput
from cclctl.host_status import HostDocument
from cclctl.live import snapshot
from cclctl.live.agent_line import agent_lines
from cclctl.records import RankSnapshot
from cclctl.runtime.hostagent.address import socket_name
from cclctl.runtime.hostagent.route import AgentRoute, AgentSignals
from cclctl.runtime.hostagent.server import GIVE_UP_WRITES, HostAgent
from cclctl.runtime.hostagent.wire import HEADER, MAX_STATUS
from cclctl.runtime.peer_process import process_state
from cclctl.store.client import StoreClient

WORKER = str(Path(__file__).parents[1] / "support" / "host_agent_worker.py")
T = TypeVar("T")
Doc = host_status.HostDocument


def _status(rank: int, started: int, completed: int, time_ns: int, **extra: Any) -> bytes:
    snap = RankSnapshot(kind="status", job="j", rank=rank, world_size=4, host="h", pid=100 + rank,
                        time_ns=time_ns, **extra)  # fmt: skip
    doc = snap.to_dict()
    doc["comms"] = {"0:0-3": {"ranks": "0-3", "last_started": started, "last_completed": completed}}
    return json.dumps(doc).encode()


class _Store:
    """The job's store as a rank's route sees it: sets and deletes, kept."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.deleted: list[str] = []

    def set(self, key: str, value: bytes) -> None:
        self.keys[key] = value

    def delete(self, key: str) -> bool:
        self.deleted.append(key)
        return self.keys.pop(key, None) is not None


class _AgentThread:
    """A HostAgent serving on its own event loop thread; its writes are kept in order."""

    def __init__(self, name: str) -> None:
        self.writes: list[bytes] = []
        self.wrote = threading.Condition()
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        ready = threading.Event()

        async def write(doc: HostDocument) -> None:
            with self.wrote:
                self.writes.append(doc.to_bytes())
                self.wrote.notify_all()

        async def main() -> None:
            self.agent = HostAgent("h", write, interval_s=60.0)  # writes come from news only
            server = await self.agent.serve(name)
            ready.set()
            await self.agent.run(self.stop)
            server.close()
            rest = asyncio.all_tasks() - {asyncio.current_task()}  # ranks' open connections
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),))
        self.thread.start()
        assert ready.wait(10)

    def written(
        self, check: Callable[[host_status.HostDocument], bool]
    ) -> host_status.HostDocument:
        """The first document written that passes ``check`` (waits for it)."""
        with self.wrote:
            seen = 0
            while True:
                for doc in self.writes[seen:]:
                    parsed = host_status.parse(doc, "test")
                    if check(parsed):
                        return parsed
                seen = len(self.writes)
                assert self.wrote.wait(10), "no such document was written"

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the agent's loop, between its steps."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def agent() -> Iterator[tuple[_AgentThread, str]]:
    name = socket_name(f"test-{os.getpid()}-{time.monotonic_ns()}", "h")
    running = _AgentThread(name)
    try:
        yield running, name
    finally:
        running.close()


def test_ranks_statuses_reach_the_store_as_one_document_with_a_summary(agent) -> None:
    running, name = agent
    store = _Store()
    routes = [AgentRoute(store, name, rank, f"status/{rank}") for rank in range(3)]
    for rank, route in enumerate(routes):
        route.set(f"status/{rank}", _status(rank, 10, 10 if rank != 1 else 9, time_ns=5))
    routes[2].set("status/2", _status(2, 11, 11, time_ns=6, finished=True))  # urgent: written
    doc = running.written(
        lambda d: len(d.statuses) == 3 and json.loads(d.statuses[2]).get("finished") is True
    )
    assert doc.summary["comms"]["0:0-3"] == {
        "ranks": 3, "started": [10, 11], "completed": [9, 11], "behind": [1],
    }  # fmt: skip
    assert store.keys == {} and all(r.via_agent and not r.direct for r in routes)
    routes[0].set("probe", b"{}")  # not a status: straight to the store
    assert store.keys == {"probe": b"{}"}


def test_a_rank_whose_connection_ends_is_named_and_its_last_status_written_directly(agent):
    running, name = agent
    store = _Store()
    route = AgentRoute(store, name, 3, "status/3")
    route.set("status/3", _status(3, 1, 1, time_ns=5))
    route.close()
    doc = running.written(lambda d: 3 in d.left)
    assert "connection to the host agent closed" in doc.left[3] and 3 in doc.statuses
    assert store.keys["status/3"] == _status(3, 1, 1, time_ns=5)  # in the store before exit


def test_a_frame_beyond_the_limits_ends_its_connection_and_keeps_nothing(agent) -> None:
    running, name = agent
    for frame in (HEADER.pack(0, MAX_STATUS + 1), HEADER.pack(1 << 30, 2) + b"{}"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(name)
        sock.sendall(frame)
        with contextlib.suppress(ConnectionResetError):  # reset: closed with bytes unread
            assert sock.recv(1) == b""  # the agent closed it
        sock.close()
    assert running.agent.statuses == {}


_RANK_PROCESS = """
import sys
from cclctl.runtime.hostagent.route import AgentRoute

class Nowhere:
    def set(self, key, value): raise AssertionError("the agent took no status")
    def delete(self, key): return True

route = AgentRoute(Nowhere(), "\\0" + sys.argv[1], 1, "status/1")
route.set("status/1", sys.argv[2].encode())
print("sent", flush=True)
sys.stdin.read()
"""


def test_the_agent_says_which_of_its_ranks_processes_are_stopped_or_gone(agent) -> None:
    """A rank's process, as the agent finds it by its connection's pid: left out while it
    runs, stopped while it is (SIGSTOP), gone once it is killed."""
    running, name = agent
    status = _status(1, 1, 1, time_ns=5).decode()
    rank = subprocess.Popen([sys.executable, "-c", _RANK_PROCESS, name[1:], status],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "sent\n"
        assert running.call(lambda: running.agent.pids) == {1: rank.pid}
        assert running.call(running.agent.processes) == {}
        os.kill(rank.pid, signal.SIGSTOP)
        _until("the rank to stop", lambda: process_state(rank.pid) == "T")
        assert running.call(running.agent.processes) == {1: (rank.pid, "stopped")}
        doc = host_status.parse(running.call(lambda: running.agent.document().to_bytes()), "t")
        assert doc.procs == {1: (rank.pid, "stopped")}
        os.kill(rank.pid, signal.SIGCONT)
        _until("the rank to run again", lambda: process_state(rank.pid) != "T")
        assert running.call(running.agent.processes) == {}
    finally:
        rank.kill()
        rank.wait(10)
    assert running.call(running.agent.processes) == {1: (rank.pid, "gone")}


def test_a_rank_seen_gone_stays_gone_until_it_speaks_again() -> None:
    """A pid reused after its rank died is not that rank running again; a new status is."""
    looks = iter(["gone", None, None])

    async def nowhere(doc: HostDocument) -> None:
        pass

    agent = HostAgent("h", nowhere, 1.0, look=lambda pid: next(looks))
    agent.pids[2] = 55
    assert agent.processes() == {2: (55, "gone")}
    assert agent.processes() == {2: (55, "gone")}  # the pid runs again: another process
    agent.receive(2, _status(2, 1, 1, time_ns=5))
    assert agent.processes() == {}


def test_each_run_of_a_job_name_has_its_own_agent() -> None:
    """A rerun under the same name (another store, or the same port with a new token)
    never finds the earlier run's agent lingering on the host."""
    first = socket_name("envjob", "h", "127.0.0.1:1000", "t1")
    assert first == socket_name("envjob", "h", "127.0.0.1:1000", "t1")
    others = {socket_name("envjob", "h", "127.0.0.1:2000", "t1"),
              socket_name("envjob", "h", "127.0.0.1:1000", "t2"),
              socket_name("envjob", "h2", "127.0.0.1:1000", "t1")}  # fmt: skip
    assert first not in others and len(others) == 3


def test_an_agent_whose_store_refuses_every_write_ends() -> None:
    async def refused(doc: HostDocument) -> None:
        raise ConnectionRefusedError("the store has gone")

    async def main() -> HostAgent:
        agent = HostAgent("h", refused, interval_s=0.01)
        agent.receive(0, _status(0, 1, 1, time_ns=5))
        await asyncio.wait_for(agent.run(asyncio.Event()), 30)  # returns: it gave up
        return agent

    agent = asyncio.run(main())
    assert agent.failed_in_a_row == agent.write_errors == GIVE_UP_WRITES


def test_a_rank_with_no_agent_publishes_its_own_status_and_moves_over_once_one_listens():
    name = socket_name(f"nobody-{os.getpid()}-{time.monotonic_ns()}", "h")
    store = _Store()
    route = AgentRoute(store, name, 0, "status/0")
    route.set("status/0", b"first")
    assert store.keys == {"status/0": b"first"} and route.direct == 1
    running = _AgentThread(name)
    try:
        route.set("status/0", _status(0, 2, 2, time_ns=9, finished=True))
        assert store.keys == {"status/0": b"first"}  # kept until the agent's document holds it
        running.written(lambda d: 0 in d.statuses)
        until = time.monotonic() + 10  # the agent notes its write once the write returned
        while 0 not in running.agent.written and time.monotonic() < until:
            time.sleep(0.01)
        route.set("status/0", _status(0, 3, 3, time_ns=10))
        assert "status/0" not in store.keys and store.deleted == ["status/0"]
    finally:
        running.close()
    route.set("status/0", b"after")  # its agent is gone: the store again, at once
    route.set("status/0", b"after")
    assert store.keys["status/0"] == b"after" and route.agent_lost


class _Signals:
    """The job's store as the dump-request poller would read it (counts its reads)."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def try_get(self, key: str) -> bytes | None:
        self.reads.append(key)
        return b"0"

    def add(self, key: str, delta: int) -> int:
        return delta

    def set(self, key: str, value: bytes) -> None:
        pass


def test_the_dump_requests_come_with_the_agents_answer_not_from_the_store(agent) -> None:
    running, name = agent
    store, signals = _Store(), _Signals()
    route = AgentRoute(store, name, 0, "status/0")
    polled = AgentSignals(route, signals)
    assert polled.try_get("signal/dump/count") == b"0" and signals.reads  # no agent yet: store
    signals.reads.clear()
    why = json.dumps({"rank": 3, "reason": "hang"})
    running.agent.news = {"dump_count": "2", "dump_why": why}
    route.set("status/0", _status(0, 1, 1, time_ns=5))
    assert polled.try_get("signal/dump/count") == b"2"
    assert polled.try_get("signal/dump/why") == why.encode() and signals.reads == []
    running.agent.news = {"dump_count": None}  # none asked yet
    route.set("status/0", _status(0, 2, 2, time_ns=6))
    assert polled.try_get("signal/dump/count") is None and signals.reads == []
    route.close()
    assert polled.try_get("signal/dump/count") == b"0" and signals.reads  # the store again


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_users_process_is_turned_away(agent) -> None:
    running, name = agent
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(name)
            sock.settimeout(10)
            try:  # the agent closes it: before the frame is sent, or with it unread
                sock.sendall(b"\0\0\0\0\0\0\0\2{}")
                code = 0 if sock.recv(1) == b"" else 2  # 2: the agent answered
            except (BrokenPipeError, ConnectionResetError):
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert running.agent.refused == 1 and running.agent.statuses == {}


# ------------------------------------------------------------------ the readers' merge
def _host_doc(statuses: dict[int, str], time_ns: int = 10) -> bytes:
    return host_status.HostDocument("h1", 77, time_ns, 1.0, statuses).to_bytes()


def test_readers_take_each_ranks_newer_status_from_its_host_or_its_own_key() -> None:
    older, newer = _status(0, 1, 1, time_ns=5).decode(), _status(1, 4, 4, 8).decode()
    listing = {
        "cclctl/j/host/h1": _host_doc({0: older, 1: newer, 2: "{not json"}),
        "cclctl/j/status/0": _status(0, 3, 3, time_ns=7),  # its agent lost: newer, its own
        "cclctl/j/status/1": _status(1, 2, 2, time_ns=6),  # left behind: older
        "cclctl/j/host/h2": b"{broken",
    }
    got = snapshot.parse("j", "addr", listing)
    assert got.statuses[0].comms["0:0-3"].last_completed == 3
    assert got.statuses[1].comms["0:0-3"].last_completed == 4
    assert got.via_agent == {1} and set(got.hosts) == {"h1"}
    assert "from h1's agent" in got.bad[2] and "not valid JSON" in got.bad_hosts["h2"]


def test_top_says_which_hosts_agent_went_silent_and_that_its_ranks_went_on() -> None:
    sec = 1_000_000_000
    listing = {
        "cclctl/j/host/h1": _host_doc({0: _status(0, 1, 1, time_ns=5 * sec).decode()}, 5 * sec),
        "cclctl/j/status/0": _status(0, 3, 3, time_ns=9 * sec),
        "cclctl/j/host/h2": b"[]",
    }
    got = snapshot.parse("j", "addr", listing)
    got.fetched_ns = 10 * sec
    assert agent_lines(got) == [
        "host agent of h1 silent since 5s ago: ranks 0 publish their own statuses",
        "host agent of h2: host document 'h2': not a cclctl.host document",
    ]
    got.fetched_ns = 7 * sec  # 2 intervals old: not yet silent
    assert agent_lines(got)[:1] == [
        "host agent of h2: host document 'h2': not a cclctl.host document"
    ]


def test_a_stopped_rank_on_another_host_is_named_by_what_its_agent_saw() -> None:
    """The reader cannot look at a process on another host; its agent did. A status of
    another process (a restarted rank: another pid) is not the one the agent saw."""
    now = time.time_ns()
    statuses = {r: _status(r, 2, 1, time_ns=now).decode() for r in range(4)}
    for pid, named in ((103, True), (999, False)):
        doc = host_status.HostDocument("h", 77, now, 1.0, statuses, procs={3: (pid, "stopped")})
        got = snapshot.parse("j", "addr", {"cclctl/j/host/h": doc.to_bytes()})
        assert got.hosts["h"].procs == {3: (pid, "stopped")}
        faults = [(v.kind, [s.rank for s in v.suspects]) for v in diagnose_live(got).faults]
        assert (("stopped", [3]) in faults) is named, faults


def test_a_rank_on_another_host_is_stale_by_its_hosts_clock_with_no_skew_margin() -> None:
    """Rank 3's status was 12 s old when its host's agent wrote (past the 10 s the reader
    allows), though only 12 s old by the reader's clock too (within the 15 s it allows
    with the skew margin): the agent's clock is the rank's own, so it owes no margin."""
    now = time.time_ns()
    sec = 1_000_000_000
    for written_s, stale in ((12, True), (1, False)):  # the agent wrote 12 s / 1 s after it
        statuses = {r: _status(r, 2, 2, time_ns=now).decode() for r in range(3)}
        statuses[3] = _status(3, 2, 2, time_ns=now - 12 * sec).decode()
        doc = host_status.HostDocument("h", 77, now - (12 - written_s) * sec, 1.0, statuses)
        got = snapshot.parse("j", "addr", {"cclctl/j/host/h": doc.to_bytes()})
        got.fetched_ns = now
        found = [v for v in diagnose_live(got).faults if v.kind == "stale"]
        assert [[s.rank for s in v.suspects] for v in found] == ([[3]] if stale else []), found
        if stale:
            assert "on that host's own clock" in found[0].evidence[0], found[0].evidence


def test_a_host_document_that_is_not_one_is_refused_in_words() -> None:
    procs = b'{"schema": "cclctl.host", "host": "h", "pid": 1, "time_ns": 1, "interval_s": 1,'
    procs += b' "statuses": {}, "procs": {"3": {"pid": 4, "state": "asleep"}}}'
    for value, words in (
        (b"[]", "not a cclctl.host"),
        (b'{"schema": "cclctl.host"}', "maps"),
        (procs, "a 'procs' entry is a pid and a state"),
    ):
        with pytest.raises(BadInput, match=words):
            host_status.parse(value, "host document 'h'")


# ------------------------------------------------------------------ real processes
def _until(what: str, check: Callable[[], T | None], timeout_s: float = 60) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_a_launched_job_publishes_through_its_agent_and_goes_on_without_it(tmp_path) -> None:
    release = tmp_path / "release"
    env = {"CCLCTL_JOB": "agent-job", "CCLCTL_STATUS_INTERVAL": "0.2", "RELEASE": str(release),
           "CCLCTL_TRACE_DIR": str(tmp_path / "trace")}  # fmt: skip
    with live_job([sys.executable, WORKER], 4, env, release) as job:
        reader = StoreClient.from_address(job.store)  # no token: what `top` reads

        def through_agent() -> snapshot.JobStatuses | None:
            keys = reader.list("cclctl/agent-job/")
            got = snapshot.parse("agent-job", job.store, keys)
            own = [k for k in keys if "/status/" in k]  # deleted once the agent's write holds it
            return got if got.via_agent == {0, 1, 2, 3} and not own else None

        seen = _until("every status through the agent, in one document for the host", through_agent)
        (doc,) = seen.hosts.values()
        assert b"cclctl.runtime.hostagent.main" in Path(f"/proc/{doc.pid}/cmdline").read_bytes()
        head = host_status.parse(reader.try_get(f"cclctl/agent-job/head/{doc.host}") or b"", "")
        assert head.is_head and sorted(head.ranks) == [0, 1, 2, 3] and head.pid == doc.pid
        os.kill(doc.pid, signal.SIGKILL)
        before = {rank: s.comms["0:0-3"].last_completed for rank, s in seen.statuses.items()}

        def on_their_own() -> snapshot.JobStatuses | None:
            got = snapshot.fetch(reader, "agent-job")
            moved = not got.via_agent and len(got.statuses) == 4
            return (
                got
                if moved
                and all(
                    s.comms["0:0-3"].last_completed > before[r] for r, s in got.statuses.items()
                )
                else None
            )

        after = _until("the ranks to publish their own statuses, still running", on_their_own)
        assert set(after.statuses) == {0, 1, 2, 3}
        said = _until("top to say so", lambda: agent_lines(snapshot.fetch(reader, "agent-job")))
        assert said[0].startswith(f"host agent of {doc.host} silent since")
        assert said[0].endswith("ranks 0-3 publish their own statuses")
        reader.close()
