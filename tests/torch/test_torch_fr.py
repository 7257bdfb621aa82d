"""PyTorch Flight Recorder dumps from real gloo jobs (torch 2.13, nothing special enabled),
read by cclctl and diagnosed: a rank that never enters, and a rank that calls another
collective. Each job runs once per module and writes both the pickle and the JSON dumps.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch_jobs import child_env, run_job

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import MISMATCH, NOT_ENTERED, Options
from cclctl.diagnose_io.flight_recorder import load_flight_recorder

pytestmark = pytest.mark.slow  # real gloo jobs writing Flight Recorder dumps

FAST = Options(stuck_after_s=1.0)  # the jobs hang for ~1.5 s before they dump


def _job(tmp_path_factory: pytest.TempPathFactory, scenario: str, ranks: int) -> Path:
    out = tmp_path_factory.mktemp(scenario)
    result, lines = run_job("fr_job.py", ranks, [scenario, str(out)], env=child_env())
    assert result.returncode == 0, lines.text()
    return out


@pytest.fixture(scope="module")
def not_entered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory, "not_entered", 2)


@pytest.fixture(scope="module")
def mismatch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory, "mismatch", 3)


def _verdicts(paths: list[str]) -> list[tuple[str, list[int], str | None, int | None, str | None]]:
    snaps = load_flight_recorder(paths)
    assert snaps is not None
    diag = diagnose(snaps, options=FAST)
    return [(v.kind, [s.rank for s in v.suspects], v.comm, v.seq, v.op) for v in diag.verdicts]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_rank_that_never_enters_is_named(not_entered: Path, fmt: str) -> None:
    # ranks 0-1: all_reduce, all_reduce, barrier = world seqs 1-3; rank 0 waits in seq 4
    assert _verdicts([str(not_entered / fmt)]) == [(NOT_ENTERED, [1], "0:0-1", 4, "all_reduce")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_rank_that_calls_another_collective_is_named(mismatch: Path, fmt: str) -> None:
    found = _verdicts([str(mismatch / fmt)])
    assert found[0] == (MISMATCH, [2], "0:0-2", 4, "all_reduce")


@pytest.mark.timeout(90)
def test_gloo_dumps_have_no_group_config_so_members_are_inferred(mismatch: Path) -> None:
    raw = json.loads((mismatch / "json" / "fr_rank0.json").read_text())
    assert all(cfg["ranks"] == "[]" for cfg in raw["pg_config"].values())  # gloo leaves it empty
    snaps = load_flight_recorder([str(mismatch / "pickle")])
    assert snaps is not None
    by_rank = {s.rank: s for s in snaps}
    assert set(by_rank) == {0, 1, 2}
    assert by_rank[0].comms["0:0-2"].ranks == [0, 1, 2]  # the default group: everyone
    assert by_rank[0].comms["1:0-1"].ranks == [0, 1]  # new_group([0, 1]), from who used it
    assert "1:0-1" not in by_rank[2].comms
    # gloo never moves `state` past "scheduled": completion comes from `retired`/pg_status
    info = by_rank[1].comms["0:0-2"]
    assert (info.last_started, info.last_completed) == (4, 3)
    assert by_rank[1].inflight is not None and by_rank[1].inflight.seq == 4


@pytest.mark.timeout(90)
def test_the_verdict_is_the_same_for_every_order_of_the_files(mismatch: Path) -> None:
    files = sorted(str(p) for p in (mismatch / "pickle").iterdir())
    documents = set()
    for order in itertools.permutations(files):
        snaps = load_flight_recorder(list(order))
        assert snaps is not None
        documents.add(json.dumps(diagnose(snaps, options=FAST).to_dict(), sort_keys=True))
    assert len(documents) == 1


@pytest.mark.timeout(90)
def test_pickle_and_json_dumps_give_the_same_records(not_entered: Path) -> None:
    from_pickle = load_flight_recorder([str(not_entered / "pickle")])
    from_json = load_flight_recorder([str(not_entered / "json")])
    assert from_pickle is not None and from_json is not None

    def calls(snaps: list) -> list:
        return [
            (s.rank, [(r.comm, r.seq, r.op, r.dtype, r.count, r.state) for r in s.records])
            for s in snaps
        ]

    assert calls(from_pickle) == calls(from_json)


@pytest.mark.timeout(90)
def test_cclctl_files_are_not_taken_for_flight_recorder_dumps(tmp_path: Path) -> None:
    (tmp_path / "cclctl-job-rank0.json").write_text('{"schema":"cclctl.dump","version":1}')
    assert load_flight_recorder([str(tmp_path)]) is None


@pytest.mark.timeout(90)
def test_pytorch_s_own_analyzer_fails_on_these_gloo_dumps(mismatch: Path) -> None:
    """The reason this reader exists: fr_trace needs pg_config, which gloo leaves empty."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.flight_recorder.fr_trace",
            str(mismatch / "pickle"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert proc.returncode != 0
    assert "KeyError" in proc.stderr


@pytest.mark.timeout(90)
def test_cclctl_diagnose_hang_reads_the_folder(not_entered: Path) -> None:
    cclctl = str(Path(sys.executable).with_name("cclctl"))
    proc = subprocess.run(
        [cclctl, "diagnose", "hang", str(not_entered / "pickle"), "--stuck-after", "1", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr  # a fault was found
    doc = json.loads(proc.stdout)
    assert [(v["kind"], v["suspects"], v["seq"]) for v in doc["verdicts"]] == [
        ("not_entered", "1", 4)
    ]
    assert doc["source"] == "dumps" and doc["ranks_seen"] == 2


@pytest.mark.timeout(90)
def test_the_suspects_call_site_comes_from_the_recorded_frames(not_entered: Path) -> None:
    snaps = load_flight_recorder([str(not_entered / "pickle")])
    assert snaps is not None
    (verdict,) = diagnose(snaps, options=FAST).verdicts
    # rank 1's newest call is the barrier (world seq 3), made from the job script itself
    assert verdict.where[0].startswith("rank 1 called barrier seq 3 of comm 0:0-1 from fr_job.py:")
    assert verdict.where[0].endswith("(Flight Recorder)")
    (stack,) = verdict.stacks[1]
    assert stack.call == "barrier seq 3 of comm 0:0-1" and stack.frames[0].func == "<module>"
