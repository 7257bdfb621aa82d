"""`cclctl launch` names a failure's origin: the launcher's revoke record and its last line.

Real processes: 4 ranks of tests/support/fault_worker.py under `python -m cclctl launch`,
with CCLCTL_FAULT striking rank 2 at seq 4; the last line must name rank 2 (or its link),
not whichever rank exited first.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from launch_helpers import PY, RANK_PROGRAM, Lines, assert_all_gone

from cclctl import revocation
from cclctl.launch.launcher import launch

pytestmark = pytest.mark.slow

WORKER = str(Path(__file__).parents[1] / "support" / "fault_worker.py")


def worker_env(tmp: Path, fault: str, timeout_s: float, **more: str) -> dict[str, str]:
    """fault_worker.py's environment: ``fault`` (none where empty), the ranks' call timeout,
    their dumps in ``tmp``, statuses every 0.2 s, and ``more``; no other CCLCTL_ variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env.update(
        CCLCTL_TIMEOUT=str(timeout_s),
        CCLCTL_TRACE_DIR=str(tmp),
        CCLCTL_STATUS_INTERVAL="0.2",
        **({"CCLCTL_FAULT": fault} if fault else {}),
        **more,
    )
    return env


def launch_faulty(
    tmp: Path, fault: str, transport: str, timeout_s: float = 5.0
) -> subprocess.CompletedProcess[str]:
    env = worker_env(
        tmp, fault, timeout_s,
        CCLCTL_TRANSPORT=transport,
        CCLCTL_RETRY_BUDGET="0",  # the raise path: a cut link is not retried
        ITERS="8",
        PAUSE="0.1",
        HOLD_ON_ERROR="0",
    )  # fmt: skip
    cmd = [PY, "-m", "cclctl", "launch", "-n", "4", "--grace", "2", "--", PY, WORKER]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)


# Each origin in the words of the launcher's diagnosis or of the ranks' revoke record.
CASES = [
    ("kill:rank=2:seq=4", r"rank 2 \(pid \d+\) died of SIGKILL in all_reduce seq 4", 2),
    (
        "stop:rank=2:seq=4",
        r"rank 2 \(pid \d+\) (was|is) stopped \((SIGSTOP|process state T)\) (at|in) "
        r"all_reduce seq 4",
        2,
    ),
    ("skip:rank=2:seq=4", r"rank 2 \(pid \d+\) (never|has not) entered all_reduce seq 4", 2),
    ("op:rank=2:seq=4:to=broadcast", r"rank 2 \(pid \d+\) called broadcast\(float32", 5),
    (
        "count:rank=2:seq=4:to=7",
        r"rank 2 \(pid \d+\) called all_reduce\(float32(, sum, count| x) 7\)",
        5,
    ),
]


@pytest.mark.timeout(100)
@pytest.mark.parametrize("transport", ["auto", "tcp"])  # auto: shared memory
@pytest.mark.parametrize(("fault", "origin", "timeout_s"), CASES, ids=[c[0] for c in CASES])
def test_the_last_line_names_the_origin(
    tmp_path: Path, transport: str, fault: str, origin: str, timeout_s: float
) -> None:
    done = launch_faulty(tmp_path, fault, transport, timeout_s)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.splitlines()[-1]
    assert re.fullmatch(
        rf"cclctl launch: {origin}[^;]*; (of )?the other 3 ranks[ ,].*; dumps in .*", last
    )
    assert last.endswith(f"; dumps in {tmp_path}/")


@pytest.mark.timeout(100)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_cut_link_is_named_by_its_two_ends(tmp_path: Path, transport: str) -> None:
    done = launch_faulty(tmp_path, "link:rank=2:seq=4:peer=3", transport)
    last = done.stderr.splitlines()[-1]
    assert re.match(
        r"cclctl launch: the link between (rank 2 and rank 3|rank 3 and rank 2) broke"
        r"( \(.*\))? in all_reduce seq 4; ",  # the reason may hold parentheses
        last,
    ), last


@pytest.mark.timeout(30)
def test_the_launcher_records_a_death_by_signal_in_the_store() -> None:
    lines = Lines()
    result = launch([PY, "-c", RANK_PROGRAM, "1=kill"], 3, output=lines, grace_s=1)
    assert result.store is not None and result.store.revoke is not None
    record = result.store.revoke
    assert (record.kind, record.origin, record.reason) == ("died", 1, "SIGKILL")
    assert (record.via, record.seen_by, record.pid) == ("launcher", -1, result.exits[1].pid)
    assert result.launcher_revoked and result.order[0] == 1
    assert record.describe().endswith("died (SIGKILL, seen by the launcher)")
    assert_all_gone(lines.pids())


FIRST_WRITER = r"""
import os, sys
from cclctl import revocation
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore
client = StoreClient.from_address(os.environ["CCLCTL_STORE"], token=os.environ["CCLCTL_TOKEN"])
store = ScopedStore.for_job(client, os.environ["CCLCTL_JOB"])
mine = revocation.Revocation(kind="error", origin=0, reason="it broke", seen_by=0)
store.compare_set(revocation.KEY, None, mine.encode())
sys.exit(3)
"""


@pytest.mark.timeout(30)
def test_a_record_already_in_the_store_is_kept() -> None:
    result = launch([PY, "-c", FIRST_WRITER], 1, output=Lines(), grace_s=1)
    assert result.returncode == 3 and not result.launcher_revoked
    assert result.store is not None and result.store.revoke is not None
    assert (result.store.revoke.kind, result.store.revoke.reason) == ("error", "it broke")
    assert revocation.KEY == "revoke"


# fault, what every survivor's error says of the origin, the verdict (kind, suspects)
EVERY_WAY = [
    ("kill:rank=2:seq=4", r"rank 2 \(pid \d+ on \S+\) died \(SIGKILL", ("dead", "2")),
    ("stop:rank=2:seq=4", r"rank 2 \(pid \d+ on \S+\) is stopped", ("stopped", "2")),
    (
        "op:rank=2:seq=4:to=broadcast",
        r"rank 2 \(pid \d+ on \S+\) called broadcast\(",
        ("mismatch", "2"),
    ),
    ("link:rank=2:seq=4:peer=3", r"link between rank 2 and rank 3 broke", ("link", "2-3")),
]


@pytest.mark.timeout(100)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize(("fault", "said", "verdict"), EVERY_WAY, ids=[c[0] for c in EVERY_WAY])
def test_after_a_launched_job_failed_every_way_of_asking_names_the_origin(
    tmp_path: Path, transport: str, fault: str, said: str, verdict: tuple[str, str]
) -> None:
    """Each survivor's error, the launcher's last line, the live diagnosis against the
    job's store (which outlives the launcher) and the post-mortem all name the origin."""
    done = launch_faulty(tmp_path, fault, transport, timeout_s=2.0)
    found = re.search(r"job (\S+) store (\S+);", done.stderr)
    assert found is not None, done.stderr
    job, store = found.group(1, 2)
    lines = done.stderr.splitlines()
    failed = [ln for ln in lines if re.match(r"\[rank \d\] rank \d failed: ", ln)]
    survivors = 4 if fault.startswith(("op:", "link:")) else 3  # the culprit raises too
    assert len(failed) == survivors, done.stderr
    wrong = [ln for ln in failed if not re.search(said, ln)]
    assert not wrong, wrong
    assert "rank 2" in lines[-1] and lines[-1].startswith("cclctl launch: "), lines[-1]
    for ask in (["--store", store, "--job", job], [str(tmp_path)]):
        told = subprocess.run(
            [PY, "-m", "cclctl", "diagnose", "hang", *ask, "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert told.returncode == 3, told.stderr
        first = json.loads(told.stdout)["verdicts"][0]
        assert (first["kind"], first["suspects"]) == verdict, (ask, first)


def _interrupted_launch(tmp: Path, fault: str, hung: str | None) -> list[str]:
    """4 ranks of fault_worker.py under the CLI with ``fault`` (ranks that never time out),
    interrupted (SIGINT) once the job's statuses show what they should: the diagnosis of
    the store names ``hung``'s words (a regex), or, with None, every rank has completed a
    call. Returns the launcher's lines on stderr (its verdict last)."""
    env = worker_env(tmp, fault, 120, ITERS="100000", PAUSE="0.05")
    cmd = [PY, "-m", "cclctl", "launch", "-n", "4", "--grace", "2", "--", PY, WORKER]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # "cclctl: job J store HOST:PORT; watch it ..."
        lines.append(first)
        found = re.search(r"job (\S+) store (\S+);", first)
        assert found, first
        job, store = found.groups()
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        look = [PY, "-m", "cclctl", "diagnose", "hang", "--store", store, "--job", job, "--json"]
        while True:  # until the store shows it: the launcher reads the same statuses
            said = subprocess.run(look, capture_output=True, text=True, timeout=60).stdout
            if not said:  # no rank has published a status yet
                continue
            doc = json.loads(said)
            # a verdict placed at its call: the waiting ranks' statuses show them in it
            verdicts = [v["summary"] for v in doc["verdicts"] if v["seq"] is not None]
            if hung is None and not doc["fault"] and _everyone_completed_a_call(doc):
                break
            if hung is not None and any(re.search(hung, s) for s in verdicts):
                break
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    return [line.rstrip("\n") for line in lines]


def _everyone_completed_a_call(doc: dict[str, Any]) -> bool:
    """Every rank of the job has published a status, and each completed a call."""
    comms = doc["comms"]
    return doc["ranks_seen"] == 4 and bool(comms) and comms[0]["last_completed"]["min"] >= 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fault", "hung", "words"),
    [
        (  # the words of the cases above: the launcher's diagnosis, as at a failure
            "skip:rank=2:seq=4",
            r"rank 2 never entered",
            r"rank 2 \(pid \d+\) (never|has not) entered all_reduce seq 4",
        ),
        (
            "stop:rank=0:seq=6",
            r"rank 0 (is|was) stopped",
            r"rank 0 \(pid \d+\) (was|is) stopped \((SIGSTOP|process state T)\) (at|in) "
            r"all_reduce seq 6",
        ),
    ],
    ids=["never-entered", "stopped"],
)
def test_an_interrupted_hung_launch_names_what_hung_it(
    tmp_path: Path, fault: str, hung: str, words: str
) -> None:
    """An operator who gives up on a hung job (Ctrl-C) learns which rank hung it."""
    said = _interrupted_launch(tmp_path, fault, hung)
    expected = rf"cclctl launch: interrupted while {words}; all ranks stopped"
    assert re.fullmatch(expected, said[-1]), "\n".join(said[-12:])


@pytest.mark.timeout(120)
def test_an_interrupted_healthy_launch_blames_nobody(tmp_path: Path) -> None:
    said = _interrupted_launch(tmp_path, "", None)
    assert said[-1] == "cclctl launch: interrupted; all ranks stopped", "\n".join(said[-12:])
