"""`cclctl top` against a real store: statuses written where ranks write them, the CLI run as
a subprocess, as an SRE would run it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from live_job import live_job

from cclctl.commands.top_screen import screen_of
from cclctl.live import cells, table
from cclctl.live.classify import classify
from cclctl.live.document import dumps, to_document
from cclctl.live.rank_view import Thresholds
from cclctl.live.snapshot import fetch
from cclctl.live.table import COLUMNS
from cclctl.records import CollectiveRecord, CommInfo, RankSnapshot
from cclctl.store.client import StoreClient, StoreServer

JOB = "j1"
COMM = "0:0-3"


def comm_of(world: int) -> str:
    return f"0:0-{world - 1}" if world > 1 else "0:0"


def status(
    rank: int,
    *,
    world: int = 4,
    job: str = JOB,
    age_s: float = 0.1,
    started: int = 10,
    completed: int = 10,
    inflight: CollectiveRecord | None = None,
    counters: dict[str, Any] | None = None,
    members: list[int] | None = None,
) -> bytes:
    """A status document as the publisher writes it, ``age_s`` seconds old."""
    comm = comm_of(world)
    snap = RankSnapshot(
        kind="status",
        job=job,
        rank=rank,
        world_size=world,
        host=f"node-{rank // 2}",
        pid=1000 + rank,
        time_ns=time.time_ns() - int(age_s * 1e9),
        comms={
            comm: CommInfo(list(range(world)) if members is None else members, started, completed)
        },
        records=[inflight] if inflight else [],
        inflight=inflight,
        counters={
            "collectives": completed,
            "bytes": completed * 4096,
            "errors": 0,
            "retries": 0,
            "hangs": 0,
            "last_busbw_gbps": {"all_reduce": 12.5},
            "publish_errors": 0,
        }
        | (counters or {}),
        metrics_url=f"http://node-{rank // 2}:9400/metrics",
    )
    return snap.to_json().encode()


def in_flight(
    seq: int, age_s: float, waiting_on: int | None = None, world: int = 4, **kw: Any
) -> CollectiveRecord:
    rec = CollectiveRecord(
        comm_of(world), seq, "all_reduce", dtype="float32", count=1 << 20, nbytes=4 << 20, **kw
    )
    rec.start_ns = time.time_ns() - int(age_s * 1e9)
    if waiting_on is not None:
        rec.waiting_on, rec.waiting_for = waiting_on, "recv"
    return rec


def put(client: StoreClient, rank: int, doc: bytes, job: str = JOB) -> None:
    client.set(f"cclctl/{job}/status/{rank}", doc)


def rendezvous(client: StoreClient, world: int, job: str = JOB) -> None:
    doc = {"rank": 0, "host": "node-0", "pid": 1000, "world_size": world}
    client.set(f"cclctl/{job}/rdzv/world_size", json.dumps(doc).encode())


def top(address: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cclctl", "top", "--store", address, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def top_json(address: str, *args: str) -> dict[str, Any]:
    out = top(address, "--json", *args)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


SLACK = ("--stale", "120")  # top's heartbeat threshold in the tests of four_ranks


def four_ranks(client: StoreClient) -> None:
    """Rank 0 idle, rank 1 waiting on 2 for 1 s, rank 2 stale for 600 s, rank 3 never seen.

    Read with ``--stale 120`` (:data:`SLACK`): a loaded machine may take many seconds to start
    top, and the fresh ranks must not turn stale meanwhile."""
    rendezvous(client, 4)
    put(client, 0, status(0))
    put(client, 1, status(1, started=11, inflight=in_flight(11, 1.0, waiting_on=2)))
    put(client, 2, status(2, age_s=600.0, started=11, completed=10))


@pytest.mark.timeout(60)
def test_json_document_fields_and_order(server: StoreServer, client: StoreClient) -> None:
    four_ranks(client)
    doc = top_json(server.address, *SLACK)
    assert {k: doc[k] for k in ("schema", "version", "job", "store", "world_size")} == {
        "schema": "cclctl.top",
        "version": 1,
        "job": JOB,
        "store": server.address,
        "world_size": 4,
    }
    assert doc["world_size_source"] == "rendezvous"
    assert (doc["ranks_seen"], doc["wrong"], doc["missing"]) == (3, 2, [3])
    assert [(r["rank"], r["state"], r["flags"]) for r in doc["ranks"]] == [
        (2, "stale", ["stale"]),
        (3, "missing", ["missing"]),
        (1, "waiting", []),  # it waits on rank 2, the suspect: before the healthy rank
        (0, "ok", []),
    ]
    ranks = {r["rank"]: r for r in doc["ranks"]}
    waiting = ranks[1]
    assert waiting["current"] | {"age_s": None} == {
        "comm": COMM,
        "seq": 11,
        "op": "all_reduce",
        "nbytes": 4 << 20,
        "dtype": "float32",
        "peer": None,
        "state": "started",
        "age_s": None,
        "step": 0,
        "steps": 0,
        "waiting_on": 2,
        "waiting_for": "recv",
    }
    assert 0.9 < waiting["current"]["age_s"] < 120
    assert (waiting["host"], waiting["pid"], waiting["wrong"]) == ("node-0", 1001, False)
    assert waiting["comms"] == {COMM: {"last_started": 11, "last_completed": 10}}
    idle = ranks[0]
    assert idle["current"] is None and idle["last_busbw_gbps"] == {"all_reduce": 12.5}
    assert (idle["collectives"], idle["errors"], idle["retries"], idle["hangs"]) == (10, 0, 0, 0)
    assert idle["metrics_url"] == "http://node-0:9400/metrics" and idle["error"] is None
    assert 0 <= idle["heartbeat_age_s"] < 120 and 599 < ranks[2]["heartbeat_age_s"] < 900
    assert ranks[3] | {"flags": []} == ranks[3] | {
        "flags": [],
        "host": "",
        "pid": 0,
        "heartbeat_age_s": None,
        "current": None,
        "error": "no status published",
    }


@pytest.mark.timeout(60)
def test_stuck_slow_behind_failed_and_erring_ranks(
    server: StoreServer, client: StoreClient
) -> None:
    """Ranks 0-2 wait 20 s in seq 42 for rank 3, which never started it: all four are wrong,
    and rank 3 is named as behind, with the seq the others wait in."""
    rendezvous(client, 6)
    for rank in range(3):
        rec = in_flight(42, 20.0, waiting_on=3, world=6)
        put(client, rank, status(rank, world=6, started=42, completed=41, inflight=rec))
    put(client, 3, status(3, world=6, started=41, completed=41))
    failed = in_flight(42, 1.0, world=6, state="timed_out", error="timed out after 1s")
    put(client, 4, status(4, world=6, started=42, completed=41, inflight=failed))
    put(client, 5, status(5, world=6, started=42, completed=42, counters={"errors": 2}))
    doc = top_json(server.address, "--slow", "10")
    got = [(r["rank"], r["state"], r["flags"], r["behind"], r["highlight"]) for r in doc["ranks"]]
    assert got == [  # the suspect, the other wrong rank, then those inside seq 42 waiting
        (3, "ok", ["behind"], {"0:0-5": 42}, "suspect"),
        (5, "ok", ["errors"], {}, "warn"),
        (0, "waiting", ["slow"], {}, "waiting"),
        (1, "waiting", ["slow"], {}, "waiting"),
        (2, "waiting", ["slow"], {}, "waiting"),
        (4, "error", ["failed"], {}, "waiting"),
    ]
    assert doc["ranks"][0]["suspect"] == {
        "kind": "not_entered",
        "reason": "never entered all_reduce seq 42",
    }
    assert [r["waits_on"] for r in doc["ranks"]] == [[], [], [3], [3], [3], [3]]
    assert doc["waiting"] == ["ranks 0-2,4 wait on rank 3 in all_reduce seq 42"]
    assert doc["ranks"][5]["error"] == "timed out after 1s" and doc["wrong"] == 6
    relaxed = top_json(server.address, "--slow", "30")  # nobody waited long enough
    flags = {r["rank"]: r["flags"] for r in relaxed["ranks"]}
    assert flags == {0: [], 1: [], 2: [], 3: [], 4: ["failed"], 5: ["errors"]}
    # rank 4's call timed out in seq 42, so the diagnosis still counts it hung (as
    # `diagnose hang --stuck-after 30` does) and still names rank 3
    assert relaxed["ranks"][0]["rank"] == 3 and relaxed["ranks"][0]["highlight"] == "suspect"


@pytest.mark.timeout(60)
def test_table_puts_stale_and_missing_ranks_first(server: StoreServer, client: StoreClient) -> None:
    four_ranks(client)
    out = top(server.address, "--once", *SLACK)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    standing = "2 suspects · 1 waiting"  # rank 0 is idle: it looks fine
    assert lines[0].startswith(f"job {JOB} · 3/4 ranks · {standing} · store {server.address}")
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [row[0] for row in rows] == ["2", "3", "1", "0"]  # rank 1 waits on the suspect
    # the suspect's state is the diagnosis' reason (rank 2 is on another host: no process
    # state to tell stopped from running), not a guess that it stopped
    assert rows[0][:9] == ["2", "node-1", "1002", rows[0][3], "status", "stale", "for", "rank", "2"]
    assert rows[1][:6] == ["3", "-", "-", "-", "missing", "-"]
    assert rows[2][4:11] == ["waiting", COMM, "11", "all_reduce", "4", "MiB", rows[2][10]]
    assert rows[2][11:13] == ["2", "recv"]
    assert rows[3][4:7] == ["ok", COMM, "10"] and "12.50" in rows[3]
    assert "busbw GB/s all_reduce" in out.stdout


@pytest.mark.timeout(60)
def test_malformed_status_is_an_error_row_not_a_crash(
    server: StoreServer, client: StoreClient
) -> None:
    rendezvous(client, 4)
    put(client, 0, status(0))
    put(client, 1, b"{not json")
    put(client, 2, status(3))  # rank 3's document under rank 2's key
    put(client, 3, status(3, counters={"errors": "many"}))
    client.set(f"cclctl/{JOB}/status/notarank", b"ignored")
    doc = top_json(server.address)
    got = {r["rank"]: (r["state"], r["flags"], r["error"]) for r in doc["ranks"]}
    assert [r["rank"] for r in doc["ranks"]] == [1, 2, 3, 0]
    assert got[0] == ("ok", [], None)
    assert got[1][:2] == ("error", ["bad_status"]) and got[1][2].startswith("bad status: not valid")
    assert got[2][2] == "bad status: the document says it is rank 3"
    assert got[3][2] == "bad status: counter 'errors' is not an integer"
    out = top(server.address, "--once")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("error: bad status") == 3


@pytest.mark.timeout(60)
def test_job_choice(server: StoreServer, client: StoreClient) -> None:
    out = top(server.address, "--once")
    assert out.returncode == 2
    assert out.stderr == (
        f"cclctl: error: no cclctl job has published status to {server.address} yet\n"
    )
    rendezvous(client, 2, job="starting")  # rendezvous only: not a job with status yet
    put(client, 0, status(0, world=2, job="train-a"), job="train-a")
    assert top_json(server.address)["job"] == "train-a"
    put(client, 0, status(0, world=2, job="train/b"), job="train/b")
    out = top(server.address, "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert "2 jobs publish status" in out.stderr and "train-a, train/b" in out.stderr
    assert "--job" in out.stderr and len(out.stderr.splitlines()) == 1
    chosen = top_json(server.address, "--job", "train/b")
    assert [(r["rank"], r["state"]) for r in chosen["ranks"]] == [(1, "missing"), (0, "ok")]
    out = top(server.address, "--once", "--job", "nope")
    assert out.returncode == 2 and "job 'nope' has published no status" in out.stderr


@pytest.mark.timeout(60)
def test_world_size_from_flag_then_statuses_then_highest_rank(
    server: StoreServer, client: StoreClient
) -> None:
    put(client, 0, status(0, world=3))
    doc = top_json(server.address)
    assert (doc["world_size"], doc["world_size_source"], doc["missing"]) == (3, "status", [1, 2])
    doc = top_json(server.address, "--world-size", "5")
    assert (doc["world_size"], doc["world_size_source"], doc["missing"]) == (
        5,
        "flag",
        [1, 2, 3, 4],
    )
    rendezvous(client, 2)  # the rendezvous is the job's own word: it wins over the flag
    doc = top_json(server.address, "--world-size", "5")
    assert (doc["world_size"], doc["world_size_source"], doc["missing"]) == (2, "rendezvous", [1])


@pytest.mark.timeout(60)
def test_unreachable_store_and_bad_flags() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        out = top(f"127.0.0.1:{port}", "--once")
    assert out.returncode == 1
    assert out.stderr.startswith(f"cclctl: error: cannot reach the store at 127.0.0.1:{port}")
    assert len(out.stderr.splitlines()) == 1
    for args, flag in (
        (["--store", "nowhere"], "--store"),
        (["--store", "127.0.0.1:1", "--stale", "0"], "--stale"),
        (["--store", "127.0.0.1:1", "--interval", "-1"], "--interval"),
    ):
        cmd = [sys.executable, "-m", "cclctl", "top", *args]
        bad = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and flag in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: Only a guard against a hang, long enough for any loaded machine: the test waits for top's
#: output to end (its exit), never for a time.
HANG_GUARD_S = 60


@pytest.mark.timeout(HANG_GUARD_S * 2 + 30)
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_refreshes_until_interrupted(
    server: StoreServer, client: StoreClient, inherited: str
) -> None:
    """In a pipe, top prints one table per refresh (like top -b) and Ctrl-C ends it cleanly,
    also when it inherits SIGINT ignored (a shell's background job: Python then raises no
    KeyboardInterrupt, and top once slept on for good).
    """
    rendezvous(client, 1)
    put(client, 0, status(0, world=1, completed=7, started=7))
    cmd = [sys.executable, "-m", "cclctl", "top", "--store", server.address, "--interval", "0.2"]
    # If Ctrl-C ever fails to end it, SIGABRT makes faulthandler print where every thread was.
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    preexec = _ignore_sigint if inherited == "ignored" else None
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=preexec,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        seqs: list[str] = []
        for line in proc.stdout:
            words = line.split()
            if words[:1] == ["0"]:
                seqs.append(words[words.index(comm_of(1)) + 1])
                put(client, 0, status(0, world=1, completed=8, started=8))
            if "8" in seqs:
                break
        proc.send_signal(signal.SIGINT)
        try:  # to the end of its output: it ended
            _, err = proc.communicate(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=HANG_GUARD_S)
            pytest.fail(f"top did not end after Ctrl-C; its stacks:\n{err[-6000:]}")
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seqs[0] == "7" and seqs[-1] == "8"


def test_only_the_rows_that_fit_are_built() -> None:
    statuses = {r: status(r, world=1000, members=[]) for r in range(1000)}
    statuses[500] = status(500, world=1000, members=[], age_s=60)
    screen = screen_of(_parsed(statuses), None, Thresholds())
    model = table.build_table(screen.view, screen.culprits, max_rows=10)
    assert [row.rank for row in model.rows] == [500, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert model.footer == "... and 990 more ranks ok"
    # the stale rank is the diagnosis' suspect (red), no longer merely "bad" by its flags
    assert model.rows[0].severity == "suspect" and model.rows[1].severity == "ok"
    assert model.rows[0].cells[COLUMNS.index("state")] == "status stale for rank 500"
    screen = screen_of(_parsed(statuses), None, Thresholds(stale_s=0.0001))
    model = table.build_table(screen.view, screen.culprits, 10)
    assert model.footer == "... and 990 more ranks (990 look wrong)"


def test_the_footer_counts_the_ranks_it_leaves_out_as_the_header_does() -> None:
    """Rank 40 never entered seq 42; the 63 others wait on it: the rows left out of a
    10-row table are waiting, not "wrong" by their slow flag."""
    world = 64
    statuses = {r: status(r, world=world, started=42, completed=41,
                          inflight=in_flight(42, 20.0, waiting_on=40, world=world))
                for r in range(world) if r != 40}  # fmt: skip
    statuses[40] = status(40, world=world, started=41, completed=41)
    screen = screen_of(_parsed(statuses), None, Thresholds(slow_s=5.0))
    model = table.build_table(screen.view, screen.culprits, max_rows=10)
    assert model.rows[0].rank == 40 and model.rows[0].severity == "suspect"
    assert model.footer == "... and 54 more ranks (54 waiting)"
    assert screen.culprits.standing(screen.view.ranks) == "1 suspect · 63 waiting"


def test_human_units() -> None:
    assert [cells.human_bytes(n) for n in (0, 1023, 1536, 4 << 20, (1 << 30) + 1)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "4 MiB",
        "1.0 GiB",
    ]
    assert [cells.human_age(s) for s in (None, 0.25, 3.21, 75, 7300)] == [
        "-",
        "250ms",
        "3.2s",
        "1m15s",
        "2h01m",
    ]


class _Listing:
    """A store reduced to its listing, for the pure tests."""

    address = "memory"

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values

    def list(self, prefix: str) -> dict[str, bytes]:
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}


def _parsed(statuses: dict[int, bytes]) -> Any:
    return fetch(_Listing({f"cclctl/{JOB}/status/{r}": v for r, v in statuses.items()}))


@pytest.mark.timeout(120)
def test_a_thousand_ranks(server: StoreServer, client: StoreClient) -> None:
    """One list() and 1,000 parses per refresh; the time is printed, not asserted (2-core CI)."""
    world = 1000
    rendezvous(client, world)
    for rank in range(world):
        if rank == 998:
            continue
        rec = in_flight(11, 0, (rank + 1) % world, world) if rank % 7 == 0 else None
        raw = status(rank, world=world, age_s=4000 if rank == 3 else 0, started=11, inflight=rec)
        put(client, rank, raw)
    start = time.perf_counter()
    statuses = fetch(client, JOB)
    fetched = time.perf_counter()
    slack = Thresholds(stale_s=600, slow_s=600)  # writing 1,000 statuses takes a while
    view = classify(statuses, thresholds=slack)
    classified = time.perf_counter()
    print(
        f"\n1,000 ranks in process: fetch+parse {1e3 * (fetched - start):.0f} ms, "
        f"classify {1e3 * (classified - fetched):.0f} ms"
    )
    start = time.perf_counter()
    doc = top_json(server.address, "--stale", "600", "--slow", "600")
    print(f"1,000 ranks: `cclctl top --once --json` took {time.perf_counter() - start:.2f} s")
    assert len(doc["ranks"]) == world
    assert (doc["ranks_seen"], doc["missing"], doc["wrong"]) == (999, [998], 2)
    assert [r["rank"] for r in doc["ranks"][:4]] == [3, 998, 0, 1]
    assert len(doc["ranks"]) == world and view.seen == 999
    out = top(server.address, "--once", "--rows", "20", "--stale", "600", "--slow", "600")
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("... and 980 more ranks ok")


@pytest.mark.timeout(30)
def test_live_package_imports_no_ui_or_runtime() -> None:
    """diagnose reuses cclctl.live, so it must stay free of typer, rich and the runtime."""
    check = (
        "import sys, cclctl.live.classify, cclctl.live.document, cclctl.live.table\n"
        "print(sorted(m for m in sys.modules if m.startswith(('rich', 'typer', 'cclctl.runtime'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
        env={**os.environ},
    )
    assert out.stdout.strip() == "[]"


LIVE_WORKER = """
import json, os, sys, time
import numpy as np
import cclctl

comm = cclctl.init()
try:
    for _ in range(5):
        comm.all_reduce(np.ones(4096, dtype=np.float32))
    ready = {"rank": comm.rank, "store": os.environ["CCLCTL_STORE"], "pid": os.getpid()}
    print(json.dumps(ready), flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
finally:
    comm.close()
"""


@pytest.mark.timeout(120)
def test_a_live_four_rank_job(tmp_path: Any) -> None:
    """A real job (cclctl.init publishes status): top lists all four ranks, each done seq 5."""
    release = tmp_path / "release"
    env = {"CCLCTL_JOB": "top-live", "CCLCTL_STATUS_INTERVAL": "0.2"}
    cmd = [sys.executable, "-c", LIVE_WORKER, str(release)]
    with live_job(cmd, 4, env, release) as job:
        deadline = time.monotonic() + 20
        while True:  # the publisher runs every 0.2 s: wait for the last all_reduce to show
            doc = top_json(job.store)
            done = [r["comms"].get(comm_of(4), {}).get("last_completed") for r in doc["ranks"]]
            if done == [5] * 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert (doc["job"], doc["world_size"], doc["world_size_source"]) == (
        "top-live",
        4,
        "rendezvous",
    )
    assert (doc["ranks_seen"], doc["wrong"], doc["missing"]) == (4, 0, [])
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    pids = {r["rank"]: r["pid"] for r in job.ready}
    for rank in doc["ranks"]:
        assert rank["state"] == "ok" and rank["pid"] == pids[rank["rank"]]
        assert rank["comms"] == {comm_of(4): {"last_started": 5, "last_completed": 5}}
        assert rank["collectives"] == 5 and rank["current"] is None
        assert rank["last_busbw_gbps"]["all_reduce"] > 0
        assert rank["heartbeat_age_s"] < 5


def test_a_rank_that_lost_the_store_says_so_in_the_store_column() -> None:
    statuses = {r: status(r) for r in range(4)}
    statuses[2] = status(2, counters={"store_reconnects": 2, "store_gap_s": 14.2})
    statuses[3] = status(3, counters={"store_reconnects": True, "store_gap_s": "x"})  # forged
    screen = screen_of(_parsed(statuses), None, Thresholds())
    model = table.build_table(screen.view, screen.culprits, max_rows=10)
    cells = {row.rank: row.cells[COLUMNS.index("store")] for row in model.rows}
    assert cells == {0: "-", 1: "-", 2: "2 reconnects, gap 14.2s", 3: "-"}
    ranks = {r["rank"]: r for r in to_document(screen.view, screen.culprits)["ranks"]}
    assert (ranks[2]["store_reconnects"], ranks[2]["store_gap_s"]) == (2, 14.2)
    assert not screen.view.wrong  # reconnecting is no fault: the status is fresh again


def test_the_json_document_prints_indented_with_a_line_per_rank() -> None:
    doc = {"schema": "cclctl.top", "job": "\x00ranks\x00 \"odd\"", "missing": [3],
           "ranks": [{"rank": 0, "current": {"seq": 4}}, {"rank": 1, "current": None}],
           "slow": {"note": "ranks"}}  # fmt: skip
    text = dumps(doc)
    assert json.loads(text) == doc
    lines = text.splitlines()
    assert lines[0] == "{" and '  "missing": [' in lines
    assert (
        '    {"rank": 0, "current": {"seq": 4}},' in lines
        and '    {"rank": 1, "current": null}' in lines
    )
    assert json.loads(dumps({**doc, "ranks": []}))["ranks"] == []
