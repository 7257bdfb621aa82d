"""A rank of a real torch job (gloo, under `cclctl run -- torchrun`) is SIGKILLed mid-loop:
the survivors whose calls fail name it dead in the job's revoke record, every survivor
carries that one record in its dump, and `cclctl diagnose hang` on the dumps names rank 2
dead, by its pid, as the origin, live ranks' gloo errors being its evidence.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, child_env, free_port

pytestmark = pytest.mark.slow  # a real torch job through cclctl run and torchrun

WORLD = 3
EXIT_FAULT = 3


def _dumps(folder: Path) -> dict[int, dict[str, Any]]:
    docs = {}
    for path in folder.glob("cclctl-*-rank*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        docs[int(doc["rank"])] = doc
    return docs


@pytest.mark.timeout(120)
def test_a_killed_torch_rank_is_the_one_origin_every_survivor_reports(tmp_path: Path) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    job, port = "torchdeath", free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path), CCLCTL_STORE_LINGER="3", **child_env())
    env.pop("CCLCTL_TRACE_DIR", None)
    cmd = [
        CCLCTL, "run", "--job", job, "--",
        TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(WORLD), "--master-addr",
        "127.0.0.1", "--master-port", str(port),
        # torchrun stops the survivors once it sees rank 2 gone; looking every 0.1 s (its
        # default), it stopped them under load before their gloo calls had failed
        "--monitor-interval", "5",
        str(HERE / "death_job.py"), str(tmp_path),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=env)
    assert out.returncode != 0, out.stdout + out.stderr
    pid = int((tmp_path / "pid.2").read_text())
    errors = {p.name: p.read_text() for p in tmp_path.glob("error.*")}
    assert errors, out.stdout + out.stderr  # some survivor's gloo call failed
    assert all("closed" in e.lower() or "reset" in e.lower() for e in errors.values()), errors

    folder = tmp_path / f"cclctl-{os.getuid()}" / job
    docs = _dumps(folder)
    survivors = sorted(r for r in docs if r != 2)
    assert survivors == [0, 1], sorted(docs)
    records = {r: docs[r].get("revoke") for r in survivors}
    assert all(rec is not None for rec in records.values()), records
    first = records[0]
    assert all(rec == first for rec in records.values()), records  # one record, not one each
    assert (first["kind"], first["origin"], first["pid"]) == ("died", 2, pid), first
    assert first["op"] == "all_reduce" and first["comm"] == f"0:0-{WORLD - 1}", first

    diag = subprocess.run(
        [CCLCTL, "diagnose", "hang", "--job", job, "--json"],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert diag.returncode == EXIT_FAULT, diag.stdout + diag.stderr
    verdict = json.loads(diag.stdout)["verdicts"][0]
    assert (verdict["kind"], verdict["suspects"]) == ("dead", "2"), verdict
    assert verdict["suspect_ranks"][0]["pid"] == pid
    assert any("revoke record" in line for line in verdict["evidence"]), verdict["evidence"]


UNCAUGHT_WORLD = 4


def _cclctl_json(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run([CCLCTL, *args, "--json"], capture_output=True, text=True, env=env)
    assert out.stdout, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return out.returncode, doc


def _dead_origin(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The diagnosis' first verdict and every verdict that calls ranks dead."""
    faults = doc["verdicts"]
    dead = [(v["kind"], v["suspects"]) for v in faults if v["kind"] == "dead"]
    return [(faults[0]["kind"], faults[0]["suspects"]), *dead]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("mode", "interval"),
    [("uncaught", None), ("uncaught", "0.1"), ("busy", None)],
    ids=["monitor-default", "monitor-0.1", "stopped-before-any-call-failed"],
)
def test_an_uncaught_death_under_torchruns_defaults_names_one_origin(
    tmp_path: Path, mode: str, interval: str | None
) -> None:
    """torchrun's own monitor (every 0.1 s by default) stops the survivors with SIGTERM once
    it sees rank 2 gone, often before their gloo calls failed (``busy``: always, they are
    inside a long step); the script catches nothing. With no --trace-dir, every survivor
    still dumps into the job's folder, names rank 2 in the job's revoke record and says in
    its last status how it ended (never "done"), so the live diagnosis, top and the
    post-mortem all name rank 2, and no rank torchrun stopped, dead."""
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    job, port = "torchuncaught", free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path), CCLCTL_STORE_LINGER="60", **child_env())
    env.pop("CCLCTL_TRACE_DIR", None)
    monitor = [] if interval is None else ["--monitor-interval", interval]
    cmd = [
        CCLCTL, "run", "--job", job, "--",
        TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(UNCAUGHT_WORLD), "--master-addr",
        "127.0.0.1", "--master-port", str(port), *monitor,
        str(HERE / "death_job.py"), str(tmp_path), mode,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0, out.stdout + out.stderr
    pid = int((tmp_path / "pid.2").read_text())
    survivors = [r for r in range(UNCAUGHT_WORLD) if r != 2]

    # live: the job's store outlives it (CCLCTL_STORE_LINGER)
    store = f"127.0.0.1:{port + 1}"
    rc, live = _cclctl_json(env, "diagnose", "hang", "--store", store, "--job", job)
    assert rc == EXIT_FAULT, live
    assert set(_dead_origin(live)) == {("dead", "2")}, (live["verdicts"], out.stderr[-3000:])
    rc, top = _cclctl_json(env, "top", "--store", store, "--job", job)
    states = {r["rank"]: r["state"] for r in top["ranks"]}
    assert all(states[r] != "done" for r in survivors), top["ranks"]
    assert top["ranks"][0]["rank"] == 2 and top["ranks"][0]["highlight"] == "suspect", top

    # post-mortem: every survivor dumped into the job's folder with no setup
    docs = _dumps(tmp_path / f"cclctl-{os.getuid()}" / job)
    assert sorted(docs) == survivors, (sorted(docs), out.stderr[-3000:])
    assert all(docs[r]["revoke"]["origin"] == 2 for r in survivors), docs
    rc, dead = _cclctl_json(env, "diagnose", "hang", "--job", job)
    assert rc == EXIT_FAULT, dead
    assert set(_dead_origin(dead)) == {("dead", "2")}, dead["verdicts"]
    assert dead["verdicts"][0]["suspect_ranks"][0]["pid"] == pid
