"""Flight Recorder parity: one hung gloo job under `cclctl run -- torchrun`, diagnosed live
from cclctl's statuses and from PyTorch's own Flight Recorder dumps of the same moment.

The job (fr_parity_job.py): the last rank never enters the world group's all_reduce that
the others wait in. Both diagnoses must name the same rank, kind, group and call; the join
between them is the live in-flight record's ``pg_name`` and ``torch_seq``, which are the
Flight Recorder entry's process group name and ``collective_seq_id``, and which both
verdicts carry. With a gather first (not traced by cclctl) the two seqs differ and the
join still holds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, free_port, released_job, until_seen

from cclctl.errors import CclError
from cclctl.live.snapshot import fetch
from cclctl.records import RankSnapshot
from cclctl.store.client import StoreClient

pytestmark = pytest.mark.slow  # a real gloo job, diagnosed live and from its dumps

EXIT_FAULT = 3
HUNG_S = 1.5  # how long the waiting ranks are in the call before it is diagnosed


def _statuses(store: str) -> dict[int, RankSnapshot]:
    try:
        with StoreClient.from_address(store, connect_timeout_s=1, timeout_s=5) as client:
            return fetch(client).statuses
    except CclError:
        return {}


def _hung(store: str, world: int, seen: list[str]) -> dict[int, RankSnapshot] | None:
    """Every rank's status, once all publish and every rank but the last has been inside
    the world group's seq 4 for longer than HUNG_S (the ``--stuck-after 1`` diagnoses).
    ``seen`` keeps what the last look found, for the failure's message."""
    statuses = _statuses(store)
    seen[:] = [
        f"rank {r}: status at {s.time_ns}, in flight {s.inflight!r}"
        for r, s in sorted(statuses.items())
    ] or ["no statuses"]
    if sorted(statuses) != list(range(world)):
        return None
    for rank in range(world - 1):
        snap = statuses[rank]
        rec = snap.inflight
        if rec is None or rec.seq != 4 or snap.time_ns - rec.start_ns < HUNG_S * 1e9:
            return None
    return statuses


def _diagnose(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [CCLCTL, "diagnose", "hang", *args, "--stuck-after", "1", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == EXIT_FAULT, out.stdout + out.stderr
    verdicts: list[dict[str, Any]] = json.loads(out.stdout)["verdicts"]
    return verdicts


def _call(verdict: dict[str, Any]) -> tuple[Any, ...]:
    return verdict["kind"], verdict["suspects"], verdict["comm"], verdict["seq"], verdict["op"]


def _open_entries(dump: Path) -> list[dict[str, Any]]:
    """The Flight Recorder entries of a JSON dump that gloo has not retired (still open)."""
    entries: list[dict[str, Any]] = json.loads(dump.read_text())["entries"]
    return [e for e in entries if not e.get("retired")]


def _joined(verdict: dict[str, Any]) -> tuple[Any, ...]:
    """A verdict as both sources must agree on it: torch's group and seq for the call."""
    return (
        verdict["kind"],
        verdict["suspects"],
        verdict["op"],
        verdict["pg_name"],
        verdict["torch_seq"],
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("world", "gather"),
    [(2, False), (4, False), (2, True)],
    ids=["2-ranks", "4-ranks", "2-ranks-untraced-gather"],
)
def test_live_diagnosis_and_flight_recorder_name_the_same_call(
    world: int, gather: bool, tmp_path: Path
) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    port, last = free_port(), world - 1
    cmd = [
        CCLCTL, "run", "--", TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(world),
        "--master-addr", "127.0.0.1", "--master-port", str(port), "--rdzv-id", "parity",
        str(HERE / "fr_parity_job.py"), str(tmp_path), *(["gather"] if gather else []),
    ]  # fmt: skip
    store, world_comm = f"127.0.0.1:{port + 1}", f"0:0-{world - 1}"
    # cclctl numbers the calls it traces: 2 all_reduces and the barrier, so the hang is seq
    # 4; torch numbers the untraced gather too (docs/torch.md: gather passes through).
    torch_seq = 5 if gather else 4
    with released_job(cmd, [tmp_path / "dump", tmp_path / "go"]) as proc:
        seen: list[str] = []
        statuses = until_seen(
            "the ranks waiting on the last", lambda: _hung(store, world, seen), proc, 100, seen
        )
        live = _diagnose("--store", store)
        (tmp_path / "dump").touch()
        until_seen(
            "every rank's Flight Recorder dump",
            lambda: all((tmp_path / f"dumped{r}").exists() for r in range(world)),
            proc,
            60,
        )
        fr = {fmt: _diagnose(str(tmp_path / "fr" / fmt)) for fmt in ("pickle", "json")}
        (tmp_path / "go").touch()
        proc.wait(timeout=60)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output
    # each names its call in its own seqs: cclctl's, and the Flight Recorder's (torch's)
    assert [_call(v) for v in live] == [("not_entered", str(last), world_comm, 4, "all_reduce")]
    for found in fr.values():
        assert [_call(v) for v in found] == [
            ("not_entered", str(last), world_comm, torch_seq, "all_reduce")
        ]
    # and both name torch's process group and seq of that call: the same verdict
    expected = [("not_entered", str(last), "all_reduce", "0", torch_seq)]
    assert [_joined(v) for v in live] == [_joined(v) for v in fr["pickle"]] == expected
    assert [_joined(v) for v in fr["json"]] == expected
    renumbered = f"torch numbers this call seq {torch_seq} of process group 0"
    assert any(line.startswith(renumbered) for line in live[0]["evidence"]) == gather
    # The join itself: each waiting rank's in-flight record (cclctl's comm and seq, as the
    # live verdict names them) carries the Flight Recorder entry's group name and seq.
    for rank in range(last):
        rec = statuses[rank].inflight
        assert rec is not None and (rec.comm, rec.seq, rec.op) == (world_comm, 4, "all_reduce")
        (entry,) = _open_entries(tmp_path / "fr" / "json" / f"fr_rank{rank}.json")
        assert entry["profiling_name"] == "gloo:all_reduce"
        assert rec.pg_name == entry["process_group"][0] == world_comm.split(":")[0]
        assert rec.torch_seq == int(entry["collective_seq_id"]) == torch_seq
    # the rank that never entered has no open call in either view
    assert statuses[last].inflight is None
    assert _open_entries(tmp_path / "fr" / "json" / f"fr_rank{last}.json") == []
