"""`cclctl top` after a rank died: the header stands on the same verdict as the rows below
it, and a rank that ended by an uncaught error, a SIGTERM or after a failed call is an
error, never `done` (a clean finish). Statuses from the record factories, as the torch
integration and the runtime publish them.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time

import pytest
from diagnose_factory import Job
from test_top_culprit import check_layout, draw, line_of

from cclctl.commands.top_screen import Screen, screen_of
from cclctl.live.document import to_document
from cclctl.live.rank_view import DONE, ERROR, Thresholds
from cclctl.live.snapshot import JobStatuses
from cclctl.records import FAILED, RankSnapshot, ending_of

UNCAUGHT = "uncaught RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:40503"


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process of this host that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def _dead_rank_2(dead_pid: int) -> Job:
    """4 ranks on this host; rank 2 (its process gone) completed seq 5 and its last status,
    fresh, looks fine; the others' seq 6 failed when rank 2's connections closed."""
    job = Job(4, done=5)
    job.t0 = time.time_ns()
    job.hosts = {r: socket.gethostname() for r in range(4)}
    job.pids = {2: dead_pid}
    job.enter([0, 1, 3], 6, state=FAILED, error="Connection closed by peer", age_s=1.0)
    return job


def _screen(job: Job, **reasons: str) -> Screen:
    """The live screen of ``job``'s statuses; ``reasons``: rank ("r0") -> its last reason."""
    snaps: dict[int, RankSnapshot] = {}
    for snap in job.snapshots("status"):
        reason = reasons.get(f"r{snap.rank}", "")
        snaps[snap.rank] = dataclasses.replace(snap, reason=reason, ending=ending_of(reason))
    statuses = JobStatuses(job.job, "127.0.0.1:1", job.t0, snaps, rdzv_world_size=job.n)
    return screen_of(statuses, None, Thresholds())


@pytest.mark.parametrize(
    "ended",
    [UNCAUGHT, "terminated by SIGTERM", "closed"],
    ids=["uncaught", "sigterm", "closed-after-a-failure"],
)
def test_ranks_that_ended_badly_are_errors_and_the_header_agrees(dead_pid: int, ended: str) -> None:
    """The torch job of issue 34: rank 2 killed, the others' gloo calls failed and their
    uncaught RuntimeError (or torchrun's SIGTERM) ended them. Their last statuses say so
    (an older writer or the runtime says only "closed", beside its failed record)."""
    shown = _screen(_dead_rank_2(dead_pid), r0=ended, r1=ended, r3=ended)
    states = {r.rank: r.state for r in shown.view.ranks}
    assert states == {0: ERROR, 1: ERROR, 2: "ok", 3: ERROR}, states
    assert DONE not in states.values()
    plain, _, rows = draw(shown, 200)  # the long errors wrap in the state column
    assert "DEAD: rank 2 is dead" in plain
    header = plain.splitlines()[0]
    assert "all look fine" not in header and "1 suspect · 3 look wrong" in header, header
    word = ended if ended != "closed" else "closed after all_reduce seq 6 failed"
    assert f"error: {word}"[:30] in line_of(rows, 0)
    assert shown.culprits.diagnosis is not None
    dead = [v for v in shown.culprits.diagnosis.faults if v.kind == "dead"]
    assert [[s.rank for s in v.suspects] for v in dead] == [[2]]  # not "ranks 0-3 are dead"
    if ended != "closed":
        assert f"ranks 0-1,3 ended after rank 2: {ended}" in dead[0].evidence
    doc = to_document(shown.view, shown.culprits)
    assert doc["wrong"] == 4
    assert {r["rank"]: r["highlight"] for r in doc["ranks"]}[2] == "suspect"


def test_the_header_never_says_fine_above_a_verdict(dead_pid: int) -> None:
    """A dead rank whose last status looked fine, beside ranks that finished cleanly: the
    rows flag nobody by their own statuses, but the verdict names rank 2, so the header
    counts it (it said "4/4 ranks · all look fine" right above "DEAD: rank 2 is dead")."""
    job = Job(4, done=5)
    job.t0 = time.time_ns()
    job.hosts = {r: socket.gethostname() for r in range(4)}
    job.pids = {2: dead_pid}
    job.finish([0, 1, 3])
    shown = _screen(job, r0="closed", r1="closed", r3="closed")
    assert [r.rank for r in shown.view.ranks if r.wrong] == []  # its status alone looks fine
    plain, _, _ = check_layout(shown, 120)
    lines = plain.splitlines()
    assert lines[1].startswith("DEAD: rank 2 is dead"), plain
    assert "· 1 suspect ·" in lines[0], lines[0]
    assert to_document(shown.view, shown.culprits)["wrong"] == 1


def test_a_clean_finish_is_still_done() -> None:
    """The other side: ranks that closed cleanly (no failed call, no revoke record, no exit
    reason) read done, and a job of them all looks fine."""
    job = Job(4, done=5)
    job.t0 = time.time_ns()
    shown = _screen(job, r0="closed", r1="closed", r2="closed", r3="closed")
    assert {r.state for r in shown.view.ranks} == {DONE}
    assert "all look fine" in check_layout(shown, 120)[0].splitlines()[0]
