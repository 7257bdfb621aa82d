"""The launcher's last line for an operator's abort or retry: no "rank -1", no "the other
4 ranks" of a 4-rank job (built from results, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cclctl.commands.launch_verdict import Origin, verdict_line
from cclctl.launch.outcome import LaunchResult, RankExit
from cclctl.launch.witness import StoreSeen
from cclctl.revocation import OPERATOR, Revocation


def ended_by(record: Revocation, ranks: int = 4) -> LaunchResult:
    """Every rank acknowledged ``record`` and exited with code 1."""
    exits = [RankExit(r, 1, None, pid=100 + r) for r in range(ranks)]
    seen = StoreSeen(record, frozenset(range(ranks)), {})
    return LaunchResult(1, exits[0], exits, job="j1", store=seen)


def operator(kind: str, reason: str) -> Revocation:
    return Revocation(kind, OPERATOR, reason, seen_by=OPERATOR, via="operator", by="ann")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CCLCTL_TRACE_DIR": str(tmp_path)}


def test_an_operators_retry_the_job_cannot_do_is_named_as_such(env: dict[str, str]) -> None:
    line = verdict_line(ended_by(operator("retry", "stuck")), None, env)
    assert line == (
        "cclctl launch: the job was aborted: operator ann asked it to retry (stuck), which it "
        "cannot do; all 4 ranks were revoked; no rank left a dump"
    )


def test_an_operators_abort_names_all_ranks(env: dict[str, str]) -> None:
    line = verdict_line(ended_by(operator("aborted", "bad data")), None, env)
    assert line == (
        "cclctl launch: the job was aborted by operator ann: bad data; all 4 ranks were revoked; "
        "no rank left a dump"
    )


def test_a_ranks_failure_still_counts_the_others(env: dict[str, str]) -> None:
    record = Revocation("died", 2, "SIGKILL", pid=102, seen_by=1)
    line = verdict_line(ended_by(record), None, env)
    assert "; the other 3 ranks were revoked;" in line


def test_a_stopped_rank_whose_call_is_not_known_yet_leaves_no_word_hanging() -> None:
    """Interrupted before any status showed the call the stopped rank holds up."""
    stopped = "was stopped (SIGSTOP) at"
    assert Origin("rank 0 (pid 7)", stopped).words() == "rank 0 (pid 7) was stopped (SIGSTOP)"
    assert Origin("rank 0 (pid 7)", stopped, "all_reduce seq 6").words() == (
        "rank 0 (pid 7) was stopped (SIGSTOP) at all_reduce seq 6"
    )
    assert Origin("rank 2 (pid 9)", "never entered").words() == "rank 2 (pid 9) never entered"
