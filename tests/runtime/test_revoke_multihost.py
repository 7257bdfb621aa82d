"""A failure is one event across hosts: two network-namespace "hosts", 2 ranks each.

Ranks 0-1 share memory on h1, ranks 2-3 on h2, and the hosts talk TCP over a veth pair (the
hybrid transport); rank 0 hosts the store (env-launched) and it lingers after rank 0 exits.
For a killed rank, a stopped one (the watchdog expires the hang), a link cut with iptables,
a mismatched collective and an operator's ``cclctl abort``, every surviving rank's error
names the true origin, and so do ``cclctl diagnose hang --store`` (live, against the
lingering store, once the survivors have exited) and ``cclctl diagnose hang`` on both
hosts' default dump folders (post-mortem). Each case runs its job once; the three tests
read its outcome. Needs root, iproute2, unshare and iptables; skipped elsewhere.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from netns_job import ADDRS, JOB, NETNS_JOB_MARKS, NetJob, TwoHosts, sh
from ports import free_port
from telemetry_helpers import wait_for

pytestmark = NETNS_JOB_MARKS


@dataclasses.dataclass
class Outcome:
    errors: dict[int, str]  # each survivor's error line
    live: str  # diagnose hang --store, exit code first
    post: str  # diagnose hang on both hosts' dump folders, exit code first
    pids: dict[int, int]


@dataclasses.dataclass(frozen=True)
class Case:
    fault: str = ""
    survivors: tuple[int, ...] = (0, 1, 2, 3)
    timeout_s: float = 3.0
    iters: int = 8
    status_interval_s: float = 0.2
    act: Callable[[NetJob], Callable[[], None]] | None = None  # during the job: returns undo
    origin: str = ""  # what every survivor's error says, {pid} the culprit's
    culprit: int | None = None
    live: str = ""  # the live diagnosis' first finding
    post: str = ""  # the post-mortem's first finding


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


def _data_link_up(job: NetJob) -> bool:
    """Rank 2 holds a TCP connection to h1 that is not the store's (its link to rank 0)."""
    out = sh(*job.hosts.exec("h2", "ss", "-tnpH", "state", "established")).stdout
    store = f"{ADDRS['h1']}:{job.port}"
    return any(
        f"pid={job.rank_pid(2)}," in ln and f"{ADDRS['h1']}:" in ln and store not in ln
        for ln in out.splitlines()
    )


def _blackhole(job: NetJob) -> Callable[[], None]:
    """On h2, drop every TCP segment to and from h1 but the store's, once rank 2's link to
    rank 0 is up: the ranks' link between the hosts goes silent, the store still answers.
    Returns the undo (the rules' removal)."""
    wait_for(lambda: _data_link_up(job), timeout_s=30)
    rules = [
        [chain, "-p", "tcp", addr, ADDRS["h1"], "!", port, str(job.port), "-j", "DROP"]
        for chain, addr, port in (("OUTPUT", "-d", "--dport"), ("INPUT", "-s", "--sport"))
    ]
    for rule in rules:
        sh(*job.hosts.exec("h2", "iptables", "-I", *rule))

    def undo() -> None:
        for rule in rules:
            sh(*job.hosts.exec("h2", "iptables", "-D", *rule), check=False)

    return undo


def _abort(job: NetJob) -> Callable[[], None]:
    """``cclctl abort`` on h1 once rank 3 froze; the frozen rank cannot acknowledge (3)."""
    wait_for(lambda: _stopped(job.rank_pid(3)), timeout_s=30)
    out = job.cclctl("h1", "abort", "--store", job.store, "--job", JOB, "--reason", "maint")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "rank 3" in out.stdout + out.stderr, out.stdout + out.stderr
    return lambda: None


# Statuses only at start (no periodic one) in the cases whose survivors exit right after
# their error: the live verdict must rest on the status each rank publishes as it fails,
# with the revoke record, not on a periodic one that happens to land in between.
QUIET = 120.0
_DEAD = "seq 3 (failed|revoked): rank {c} \\(pid {pid} on h2\\) died \\(SIGKILL"
CASES = {
    "kill-rank2": Case(
        "kill:rank=2:seq=3",
        (0, 1, 3),
        culprit=2,
        status_interval_s=QUIET,
        origin=_DEAD.format(c=2, pid="{pid}"),
        live=r"rank 2 is dead",
        post=r"DEAD\s+rank 2 is dead: SIGKILL",
    ),
    "kill-rank3": Case(
        "kill:rank=3:seq=3",
        (0, 1, 2),
        culprit=3,
        status_interval_s=QUIET,
        origin=_DEAD.format(c=3, pid="{pid}"),
        live=r"rank 3 is dead",
        post=r"DEAD\s+rank 3 is dead: SIGKILL",
    ),
    # The first watchdog to expire names rank 3: rank 2's sees the process stopped (its
    # host), rank 0's or 1's read it in h2's agent's document, or, before the agent wrote
    # one since the stop, say that rank 3 has not entered seq 3. The live diagnosis on h1
    # reads the stop in the agent's document too.
    "stop-rank3": Case(
        "stop:rank=3:seq=3",
        (0, 1, 2),
        culprit=3,
        origin=r"seq 3 (revoked|timed out after [\d.]+s waiting to recv from rank \d): "
        r"rank 3 \(pid {pid} on h2\) (is stopped|has not entered all_reduce seq 3)",
        live=r"STOPPED\s+rank 3 is stopped \(SIGSTOP\)",
        post=r"rank 3 (left no dump|has not entered all_reduce seq 3"
        r"|is stopped \(process state T\))",  # the last: rank 2's watchdog was first
    ),
    "link-0-2": Case(
        iters=200,
        act=_blackhole,
        origin=r"(failed|revoked): link between rank (0 and rank 2|2 and rank 0) broke",
        live=r"LINK\s+link (0<->2|2<->0) (is broken or stalled|broke)",
        post=r"LINK\s+link (0<->2|2<->0) broke",
    ),
    "mismatch-rank2": Case(
        "op:rank=2:seq=3:to=broadcast",
        culprit=2,
        origin=r"seq 3 (failed|revoked): rank 2 \(pid {pid} on h2\) called broadcast\(",
        live=r"MISMATCH\s+rank 2 called broadcast\(",
        post=r"MISMATCH\s+rank 2 called broadcast\(",
    ),
    "abort": Case(
        "stop:rank=3:seq=3",
        (0, 1, 2),
        timeout_s=60,  # the watchdog stays quiet: only the operator ends the calls
        status_interval_s=QUIET,
        act=_abort,
        origin=r"seq 3 aborted by operator \S+@\S+: maint(; dumps in |$)",
        live=r"ABORTED\s+aborted by operator \S+@\S+: maint",
        post=r"ABORTED\s+aborted by operator \S+@\S+: maint",
    ),
}


def _said(out: subprocess.CompletedProcess[str]) -> str:
    return f"exit {out.returncode}\n{out.stdout}{out.stderr}"


def _run(case: Case, hosts: TwoHosts, tmp: Path) -> Outcome:
    """The job once: its survivors' error lines, then both diagnoses; afterwards nothing of
    it is left (ranks, lingering store, iptables rules)."""
    job = NetJob(
        hosts,
        tmp,
        free_port(),
        fault=case.fault,
        timeout_s=case.timeout_s,
        iters=case.iters,
        status_interval_s=case.status_interval_s,
    )
    undo: Callable[[], None] = lambda: None  # noqa: E731
    try:
        pids = {r: job.rank_pid(r) for r in range(4)}
        if case.act is not None:
            undo = case.act(job)
        errors = job.errors(list(case.survivors))
        live = job.cclctl("h1", "diagnose", "hang", "--store", job.store, "--job", JOB)
        post = job.cclctl("h1", "diagnose", "hang", *job.dump_dirs())
    finally:
        undo()
        job.kill_ranks()
        hosts.kill_all()
    return Outcome(errors, _said(live), _said(post), pids)


_outcomes: dict[str, Outcome] = {}


@pytest.fixture
def outcome(
    request: pytest.FixtureRequest, hosts: TwoHosts, tmp_path_factory: pytest.TempPathFactory
) -> Outcome:
    name = request.node.callspec.params["case"]
    if name not in _outcomes:
        _outcomes[name] = _run(CASES[name], hosts, tmp_path_factory.mktemp(name))
    return _outcomes[name]


def _first_finding(said: str) -> str:
    """The diagnosis' one finding (it must be one: the origin, the rest its evidence)."""
    found = [ln for ln in said.splitlines() if re.match(r"\d+\. ", ln)]
    assert said.startswith("exit 3\n") and len(found) == 1, said
    return found[0]


@pytest.mark.parametrize("case", list(CASES))
def test_every_survivor_names_the_origin(case: str, outcome: Outcome) -> None:
    spec = CASES[case]
    pid = outcome.pids[spec.culprit] if spec.culprit is not None else 0
    pattern = spec.origin.replace("{pid}", str(pid))
    wrong = {r: e for r, e in outcome.errors.items() if not re.search(pattern, e)}
    assert not wrong, f"ranks not naming the origin ({pattern!r}): {outcome.errors}"


@pytest.mark.parametrize("case", list(CASES))
def test_the_live_diagnosis_against_the_lingering_store_names_the_origin(
    case: str, outcome: Outcome
) -> None:
    assert re.search(CASES[case].live, _first_finding(outcome.live)), outcome.live


@pytest.mark.parametrize("case", list(CASES))
def test_the_post_mortem_diagnosis_of_both_hosts_dumps_names_the_origin(
    case: str, outcome: Outcome
) -> None:
    assert re.search(CASES[case].post, _first_finding(outcome.post)), outcome.post
