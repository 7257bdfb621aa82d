"""A DDP job under `cclctl run -- torchrun` where rank 1 stops (SIGSTOP) or waits in its own
code before its forward pass, so the other ranks block inside DDP's gradient all_reduce:
`cclctl diagnose hang` live (against the store rank 0 hosts) and post-mortem (the dumps in
the job's default folder) name rank 1, the ranks waiting on it and the all_reduce's seq
once the watchdog expired the call; `cclctl top` shows rank 1 as the suspect. Then rank 1
goes on and the job ends normally. How soon the verdict comes is a figure, not a test: the
polls here allow for a loaded machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, child_env, free_port

from cclctl.diagnose.text import ranks_word
from cclctl.diagnose_io.live import diagnose_live
from cclctl.errors import CclError
from cclctl.live.snapshot import fetch
from cclctl.store.client import StoreClient

pytestmark = pytest.mark.slow  # real DDP jobs through cclctl run and torchrun

TIMEOUT_S = 3.0  # the job's CCLCTL_TIMEOUT
HANG_STEP = 3
EXIT_FAULT = 3


class Job:
    """The DDP job, its step files (``<pid> <seq>``) and its store."""

    def __init__(self, tmp: Path, world: int, how: str) -> None:
        if not Path(TORCHRUN).exists():
            pytest.skip("torchrun is not installed next to this Python")
        self.world, self.how, self.flag = world, how, tmp / "go"
        self.job = f"ddphang-{how}-{world}"
        port = free_port()
        self.store = f"127.0.0.1:{port + 1}"
        self.env = dict(os.environ, TMPDIR=str(tmp), CCLCTL_STORE_LINGER="3", **child_env())
        self.env.pop("CCLCTL_TRACE_DIR", None)
        self.folder = tmp / f"cclctl-{os.getuid()}" / self.job
        self.cmd = [
            CCLCTL, "run", "--timeout", str(TIMEOUT_S), "--job", self.job, "--",
            TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(world),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            str(HERE / "ddp_hang_job.py"), how, str(HANG_STEP), str(self.flag),
        ]  # fmt: skip

    def step(self, rank: int, step: int) -> tuple[int, int] | None:
        """(pid, seq of the step's all_reduce) once ``rank`` entered ``step``."""
        try:
            pid, seq = Path(f"{self.flag}.{rank}.step{step}").read_text().split()
            return int(pid), int(seq)
        except (OSError, ValueError):
            return None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CCLCTL, *args], capture_output=True, text=True, timeout=30, env=self.env
        )


@contextlib.contextmanager
def _running(job: Job) -> Iterator[subprocess.Popen[str]]:
    """Run the job; on the way out let rank 1 go on, and stop the job if it does not end."""
    proc = subprocess.Popen(
        job.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job.env
    )
    try:
        yield proc
    finally:
        job.flag.touch()
        rank1 = job.step(1, HANG_STEP - 1)
        if rank1 is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank1[0], signal.SIGCONT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _until(
    what: str,
    check: Callable[[], Any],
    proc: subprocess.Popen[str],
    deadline: float,
    last: dict[str, Any] | None = None,
) -> Any:
    """``check()``'s first true value, polled until the monotonic ``deadline`` (``last``:
    what the checks saw, for the failure's message)."""
    while True:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the job ended before {what}: {proc.stdout.read() if proc.stdout else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} by the deadline; the checks last saw: {last!r}")
        time.sleep(0.1)


def _entered(job: Job) -> tuple[float, int] | None:
    """When the last of the other ranks entered the hung step (monotonic), and the seq."""
    others = [r for r in range(job.world) if r != 1]
    seen = [job.step(r, HANG_STEP) for r in others]
    if any(s is None for s in seen):
        return None
    seqs = {s[1] for s in seen if s is not None}
    assert len(seqs) == 1, seqs
    newest = max(Path(f"{job.flag}.{r}.step{HANG_STEP}").stat().st_mtime for r in others)
    return time.monotonic() - (time.time() - newest), seqs.pop()


def _names_rank1(doc: dict[str, Any], seq: int, world: int) -> dict[str, Any] | None:
    """The first verdict if it names rank 1 (stopped or never entered) at ``seq`` of the
    world's all_reduce, with the ranks waiting on it."""
    verdicts = doc.get("verdicts") or []
    if not verdicts:
        return None
    v = verdicts[0]
    place = (v["kind"] in ("stopped", "not_entered"), v["suspects"], v["comm"], v["seq"], v["op"])
    if place != (True, "1", f"0:0-{world - 1}", seq, "all_reduce"):
        return None
    waiting = ranks_word(r for r in range(world) if r != 1)
    return v if any(waiting in line and "wait" in line for line in v["evidence"]) else None


def _live(job: Job, seq: int, last: dict[str, Any]) -> dict[str, Any] | None:
    try:
        with StoreClient.from_address(job.store, connect_timeout_s=1, timeout_s=5) as client:
            doc = diagnose_live(fetch(client, job.job)).to_dict()
    except CclError as exc:
        last["live"] = str(exc)
        return None
    last["live"] = doc.get("verdicts")
    return _names_rank1(doc, seq, job.world)


def _post_mortem(job: Job, seq: int, last: dict[str, Any]) -> dict[str, Any] | None:
    if not job.folder.is_dir() or not list(job.folder.glob("cclctl-*-rank0.json")):
        last["post-mortem"] = f"no dumps in {job.folder}"
        return None
    out = job.cli("diagnose", "hang", "--job", job.job, "--json")
    last["post-mortem"] = (out.returncode, out.stdout[-2000:], out.stderr[-500:])
    if out.returncode != EXIT_FAULT:
        return None
    return _names_rank1(json.loads(out.stdout), seq, job.world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world", "how"), [(2, "stop"), (4, "stop"), (2, "wait")])
def test_a_ddp_hang_is_named_live_and_post_mortem(world: int, how: str, tmp_path: Path) -> None:
    job = Job(tmp_path, world, how)
    with _running(job) as proc:
        since, seq = _until("others entered", lambda: _entered(job), proc, time.monotonic() + 90)
        deadline = since + TIMEOUT_S + 60.0  # a correctness bound, not a speed goal
        last: dict[str, Any] = {}
        live = _until("live verdict", lambda: _live(job, seq, last), proc, deadline, last)
        dumps = _until(
            "post-mortem verdict", lambda: _post_mortem(job, seq, last), proc, deadline, last
        )
        assert live["kind"] == dumps["kind"] == ("stopped" if how == "stop" else "not_entered")
        cli = job.cli("diagnose", "hang", "--store", job.store, "--job", job.job, "--json")
        assert cli.returncode == EXIT_FAULT, cli.stdout + cli.stderr
        assert _names_rank1(json.loads(cli.stdout), seq, world) is not None
        top = job.cli("top", "--store", job.store, "--job", job.job, "--once", "--json")
        assert top.returncode in (0, EXIT_FAULT), top.stderr
        ranks = {r["rank"]: r for r in json.loads(top.stdout)["ranks"]}
        assert ranks[1]["highlight"] == "suspect"
        assert ranks[1]["suspect"]["kind"] == live["kind"]
        assert all(ranks[r]["highlight"] == "waiting" for r in ranks if r != 1)
        job.flag.touch()
        rank1 = job.step(1, HANG_STEP - 1)
        assert rank1 is not None
        if how == "stop":
            os.kill(rank1[0], signal.SIGCONT)
        proc.wait(timeout=40)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output
    assert "the hang at all_reduce seq" in output  # withdrawn once the call completed
