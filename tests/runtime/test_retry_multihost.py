"""A TCP link fault mid all_reduce is ridden through: two network-namespace "hosts", 2 ranks each.

Ranks 0-1 share memory on h1, ranks 2-3 on h2, and the hosts talk TCP over a veth pair (the
hybrid transport). Faults come from the system's own tools: ``ss -K`` resets the ranks' TCP
connections between the hosts (not the store's) mid 64 MiB all_reduce, ``ip link set down``
takes the veth away for a while. With ``CCLCTL_RETRY_BUDGET`` on, every rank finishes with
the exact result (the sum of whole numbers, computed here): a reset is survived in the step
(the link made again, its lost message sent again) or, where that cannot be done, by a
retry into a later epoch, as an outage is; past the budget every rank raises the same
fault's error and its buffer holds its input. Needs root, iproute2 and unshare; skipped
elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from netns_job import ADDRS, NETNS_JOB_MARKS, NetJob, TwoHosts, sh
from ports import free_port
from retry_worker import rank_input

pytestmark = NETNS_JOB_MARKS

WORKER = str(Path(__file__).parents[1] / "support" / "retry_worker.py")
MIX = str(Path(__file__).parents[1] / "support" / "retry_mix_worker.py")
COUNT = 16 << 20  # 64 MiB of float32 per rank


def _digest(arr: np.ndarray) -> str:
    return hashlib.sha256(arr.tobytes()).hexdigest()


@pytest.fixture(scope="module")
def expected() -> tuple[str, list[str]]:
    """The fault-free result's digest (exact: whole numbers) and each rank's input's."""
    inputs = [rank_input(r, COUNT) for r in range(4)]
    total = np.sum([x.astype(np.float64) for x in inputs], axis=0).astype(np.float32)
    return _digest(total), [_digest(x) for x in inputs]


class Lines:
    """Every rank's stdout lines, read on threads, waited for by pattern."""

    def __init__(self, job: NetJob) -> None:
        self.seen: list[list[str]] = [[] for _ in job.procs]
        self._news: queue.Queue[int] = queue.Queue()
        for rank, proc in enumerate(job.procs):
            threading.Thread(target=self._read, args=(rank, proc), daemon=True).start()

    def _read(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            self.seen[rank].append(raw.decode().rstrip("\n"))
            self._news.put(rank)
        self._news.put(rank)

    def wait(self, rank: int, pattern: str, timeout_s: float = 60.0) -> str:
        """The first line of ``rank`` matching ``pattern`` (fails once it never comes)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = next((ln for ln in self.seen[rank] if re.match(pattern, ln)), None)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"rank {rank} never printed {pattern!r}: {self.seen[rank]}"
            with contextlib.suppress(queue.Empty):
                self._news.get(timeout=left)


def _job(
    hosts: TwoHosts,
    tmp: Path,
    iters: int,
    budget_s: float,
    timeout_s: float = 30.0,
    hold: tuple[str, int] | None = None,
) -> tuple[NetJob, Lines]:
    """``hold``: (path, rank): that rank waits before each call ``i`` for ``path.i``."""
    extra = {"CCLCTL_RETRY_BUDGET": str(budget_s), "COUNT": str(COUNT)}
    if hold is not None:
        extra.update(HOLD=hold[0], HOLD_RANK=str(hold[1]))
    job = NetJob(
        hosts,
        tmp,
        free_port(),
        timeout_s=timeout_s,  # 30 s: the watchdog stays out of it, link faults are the retry's
        iters=iters,
        worker=WORKER,
        extra=extra,
    )
    return job, Lines(job)


def _reset_links(job: NetJob) -> int:
    """``ss -K`` on h2: every TCP connection to h1 but the store's is reset; how many were
    (none where a retry's new links are not made yet: they are made on first use)."""
    flt = f"( dst {ADDRS['h1']} and not dport = :{job.port} )"
    out = sh(*job.hosts.exec("h2", "ss", "-K", "-H", "-tn", "state", "established", flt))
    return sum(1 for line in out.stdout.splitlines() if line.strip())


def _link(hosts: TwoHosts, state: str) -> None:
    sh("ip", "-n", hosts.ns["h2"], "link", "set", hosts.devs[1], state)


def _finished(job: NetJob, lines: Lines, iters: int, result: str) -> None:
    """Every rank printed every digest, each the exact sum, and exited 0."""
    for rank in range(4):
        lines.wait(rank, r"done$")
        digests = [ln.split()[2] for ln in lines.seen[rank] if ln.startswith("digest ")]
        assert digests == [result] * iters, f"rank {rank}: {lines.seen[rank]}"
        assert job.procs[rank].wait(30) == 0


def _epochs(lines: Lines) -> list[int]:
    return [int(lines.wait(r, r"epoch \d+$").split()[1]) for r in range(4)]


def _dump(job: NetJob, rank: int) -> dict:
    """The document ``rank`` wrote as it closed (its host's dump folder)."""
    folder = job.dump_dirs()[0 if rank < 2 else 1]
    return json.loads((Path(folder) / f"cclctl-netjob-rank{rank}.json").read_text())


def _resumes(job: NetJob, rank: int) -> int:
    """How many of its links ``rank`` made again after a reset, by its own count."""
    return int(_dump(job, rank)["counters"]["link_resumes"])


#: The ranks with a TCP link: the host leaders, ranks 0 and 2 (the others share memory).
LEADERS = (0, 2)


def test_a_reset_as_a_call_starts_is_resumed_in_the_step(
    hosts: TwoHosts, tmp_path: Path, expected: tuple[str, list[str]]
) -> None:
    """Resets as rank 2 enters calls 1 and 3: every message on the leaders' link is still
    held by its sender, so each reset is survived in the step, no retry."""
    iters = 5
    hold = str(tmp_path / "go")
    job, lines = _job(hosts, tmp_path, iters, budget_s=20, hold=(hold, 2))
    try:
        for i in range(iters):
            lines.wait(2, rf"iter {i} ")  # rank 2 holds before entering call i
            if i in (1, 3):
                assert _reset_links(job) == 1  # the leaders' link
            Path(f"{hold}.{i}").touch()
        _finished(job, lines, iters, expected[0])
        assert _epochs(lines) == [0] * 4, lines.seen  # nothing re-ran
        assert [_resumes(job, r) for r in LEADERS] == [2, 2]
        assert not any(ln.startswith("rerun ") for seen in lines.seen for ln in seen)
    finally:
        job.kill_ranks()
        hosts.kill_all()


def test_resets_mid_transfer_give_the_exact_result(
    hosts: TwoHosts, tmp_path: Path, expected: tuple[str, list[str]]
) -> None:
    """Resets a while into calls (mid transfer, or as a leader finishes its last step and a
    message is lost past resending): each is survived, by a resume or by a retry."""
    iters, hits = 5, 0
    job, lines = _job(hosts, tmp_path, iters, budget_s=20)
    try:
        for i in (1, 2, 3):
            lines.wait(2, rf"iter {i} ")
            time.sleep(0.04 * i)  # where in the call it lands is what this case varies
            hits += _reset_links(job) > 0
        _finished(job, lines, iters, expected[0])
        epochs = _epochs(lines)
        assert hits
        for rank in LEADERS:
            assert _resumes(job, rank) + epochs[rank] >= hits, (rank, epochs, hits)
    finally:
        job.kill_ranks()
        hosts.kill_all()


def test_a_link_closed_for_good_is_renewed_by_a_retry(
    hosts: TwoHosts, tmp_path: Path, expected: tuple[str, list[str]]
) -> None:
    """Rank 2 closes its link to rank 0 before seq 2 and refuses it in that epoch (the
    plan's ``link`` fault), so no resume can make it again: the call re-runs under a
    retry, every rank ends in a later epoch, and the records show each attempt."""
    iters = 3
    job = NetJob(
        hosts, tmp_path, free_port(), timeout_s=30.0, iters=iters, worker=WORKER,
        extra={"CCLCTL_RETRY_BUDGET": "20", "COUNT": str(COUNT),
               "CCLCTL_FAULT": "link:rank=2:seq=2:peer=0"},
    )  # fmt: skip
    lines = Lines(job)
    try:
        _finished(job, lines, iters, expected[0])
        assert all(e >= 1 for e in _epochs(lines))  # the links were renewed
        _retries_recorded(job, lines)
    finally:
        job.kill_ranks()
        hosts.kill_all()


def test_resets_mid_all_gather_and_broadcast_give_the_exact_result(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    """The other calls a retry re-runs, 16 MiB in, 64 MiB gathered: resets while rank 2 is
    in an all_gather (out of place, then in place) and in a broadcast."""
    count, calls = 4 << 20, ("gather", "gather_in_place", "bcast_in_place")
    env = {"CCLCTL_RETRY_BUDGET": "20", "COUNT": str(count), "CALLS": ",".join(calls)}
    job = NetJob(hosts, tmp_path, free_port(), timeout_s=30, iters=2, worker=MIX, extra=env)
    lines = Lines(job)
    xs = [rank_input(r, count) for r in range(4)]
    want = {"gather": _digest(np.concatenate(xs)), "bcast_in_place": _digest(xs[-1])}
    want["gather_in_place"] = want["gather"]
    hits = 0
    try:
        for i, call in ((0, "gather"), (0, "bcast_in_place"), (1, "gather_in_place")):
            lines.wait(2, rf"call {i} {call}$")
            hits += _reset_links(job) > 0
        for rank in range(4):
            lines.wait(rank, r"done$")
            results = [ln.split()[1:] for ln in lines.seen[rank] if ln.startswith("result ")]
            assert results == [[str(i), c, want[c]] for i in range(2) for c in calls], (
                f"rank {rank}: {lines.seen[rank]}"
            )
            assert job.procs[rank].wait(30) == 0
        # The resets were survived, by a resume or by a retry. The all_gather's ring
        # crosses the hosts twice (1-2, 3-0), so which ranks resume depends on the call,
        # and a link a reset cut that no later call used is never noticed.
        epochs, resumes = _epochs(lines), [_resumes(job, r) for r in range(4)]
        assert hits and max(resumes) + max(epochs) >= 1, (resumes, epochs, hits)
    finally:
        job.kill_ranks()
        hosts.kill_all()


def _retries_recorded(job: NetJob, lines: Lines) -> None:
    """Each rank's dump (written at its exit: its calls had failed attempts) counts the
    retries, and at every seq it re-ran holds a first attempt that did not complete and a
    later attempt, of a later epoch, that did."""
    for rank in range(4):
        reruns = [ln.split() for ln in lines.seen[rank] if ln.startswith("rerun ")]
        assert reruns, lines.seen[rank]
        doc = _dump(job, rank)
        assert doc["counters"]["retries"] >= len(reruns), (doc["counters"], reruns)
        for _, _, seq, attempt, _ in reruns:
            runs = [r for r in doc["records"] if r["seq"] == int(seq) and r["peer"] is None]
            if attempt == "1":
                if not runs and doc["reason"] == "finished":
                    # No call of this rank failed (the failure reached it between calls),
                    # so its final document is the clean status: the last records only.
                    continue
                _ran_once_after_the_failure(doc["records"], int(seq), runs)
                continue
            first = [r for r in runs if r["attempt"] == 1]
            last = max(runs, key=lambda r: r["attempt"])
            assert int(attempt) == last["attempt"] >= 2 and last["state"] == "completed", runs
            assert first and first[0]["state"] != "completed", runs
            assert last["epoch"] > first[0]["epoch"], runs


def _ran_once_after_the_failure(records: list[dict], seq: int, runs: list[dict]) -> None:
    """A rank whose retried call ran once was between calls when the reset's failure
    reached it (done with seq - 1, or a call ahead of the others and serving them seq - 1
    by a broadcast of the new epoch): its call at ``seq`` was refused before it was
    numbered, so its one run, completed, is attempt 1 of a later epoch than seq - 1's."""
    assert len(runs) == 1 and runs[0]["state"] == "completed", runs
    before = [r["epoch"] for r in records if r["seq"] == seq - 1 and r["peer"] is None]
    assert before and runs[0]["epoch"] > min(before), (before, runs)


def test_lost_packets_give_the_exact_result(
    hosts: TwoHosts, tmp_path: Path, expected: tuple[str, list[str]]
) -> None:
    """Each end of the veth drops 2% of the packets it receives (``iptables -m statistic``,
    this kernel having no netem): TCP retransmits, every result is exact, no rank fails."""
    rules = [
        (host, ["INPUT", "-i", dev, "-m", "statistic", "--mode", "random", "--probability",
                "0.02", "-j", "DROP"])
        for host, dev in zip(hosts.ns, hosts.devs, strict=True)
    ]  # fmt: skip
    for host, rule in rules:
        sh(*hosts.exec(host, "iptables", "-A", *rule))
    iters = 3
    job, lines = _job(hosts, tmp_path, iters, budget_s=20)
    try:
        _finished(job, lines, iters, expected[0])
        dropped = sh(*hosts.exec("h2", "iptables", "-L", "INPUT", "-v", "-n", "-x")).stdout
        assert int(dropped.splitlines()[2].split()[0]) > 0, dropped  # packets were dropped
    finally:
        for host, rule in rules:  # the hosts stay for the module's other tests
            sh(*hosts.exec(host, "iptables", "-D", *rule), check=False)
        job.kill_ranks()
        hosts.kill_all()


@pytest.mark.parametrize("down_s", [0.5, 2.0])
def test_a_link_down_for_a_while_finishes_after_it_returns(
    hosts: TwoHosts, tmp_path: Path, expected: tuple[str, list[str]], down_s: float
) -> None:
    iters = 3
    job, lines = _job(hosts, tmp_path, iters, budget_s=20)
    try:
        lines.wait(2, r"iter 1 ")
        _link(hosts, "down")
        time.sleep(down_s)  # the outage itself: its length is what this case is about
        _link(hosts, "up")
        _finished(job, lines, iters, expected[0])
    finally:
        _link(hosts, "up")
        job.kill_ranks()
        hosts.kill_all()


def test_past_the_budget_every_rank_raises_the_same_origin_and_keeps_its_input(
    hosts: TwoHosts, tmp_path: Path, expected: tuple[str, list[str]]
) -> None:
    job, lines = _job(hosts, tmp_path, 3, budget_s=5)
    try:
        lines.wait(2, r"iter 1 ")
        _link(hosts, "down")
        down = time.monotonic()
        failed = [lines.wait(r, r"failed 1 ", timeout_s=30) for r in range(4)]
        took = time.monotonic() - down
        _link(hosts, "up")  # only once every rank has raised: they did not wait for it
    finally:
        _link(hosts, "up")
        job.kill_ranks()
        hosts.kill_all()
    held = [ln.split()[2] for ln in failed]
    assert held == expected[1], failed  # each buffer holds its own input, not a mix
    origins = {re.search(r"link between rank \d+ and rank \d+", ln) for ln in failed}
    names = {m.group(0) if m else None for m in origins}
    assert len(names) == 1 and None not in names, failed
    assert all("CCLCTL_RETRY_BUDGET=5s" in ln for ln in failed), failed
    print(f"every rank raised {took:.2f}s after the link went down")


def test_a_stopped_rank_is_a_hang_not_a_link_fault_to_retry(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    """Rank 3 stops at its second 64 MiB all_reduce: its peers' windows close, which is no
    stalled link (nothing is lost), so no retry starts; the watchdog names rank 3, stopped
    (it stopped publishing its status) or not entered (the stop came as it printed "iter
    1", before the call). A rank that takes a peer's teardown for a link fault raises the
    job's failure, not a retry that ran out."""
    job, lines = _job(hosts, tmp_path, 3, budget_s=20, timeout_s=4.0)
    stopped = job.rank_pid(3)
    try:
        lines.wait(3, r"iter 1 ")
        os.kill(stopped, signal.SIGSTOP)
        failed = [lines.wait(r, r"failed 1 ", timeout_s=60) for r in range(3)]
    finally:
        os.kill(stopped, signal.SIGCONT)
        job.kill_ranks()
        hosts.kill_all()
    for line in failed:
        assert "rank 3" in line, failed
        assert "stopped" in line or "has not entered all_reduce seq 2" in line, failed
        assert "link between" not in line and "not recovered" not in line, failed
