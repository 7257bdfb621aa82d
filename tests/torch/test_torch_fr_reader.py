"""The Flight Recorder reader on hand-made dumps: the formats NCCL writes (group config,
``state`` updates, point-to-point names), a hostile pickle, and input that is not a dump.
Real gloo dumps are covered in test_torch_fr.py.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import MISSING, NOT_ENTERED, Options
from cclctl.errors import BadInput
from cclctl.integrations.torch_fr import load_flight_recorder, sniff
from cclctl.records import COMPLETED, STARTED

NS = 1_700_000_000_000_000_000


def entry(seq: int, name: str = "nccl:all_reduce", pg: tuple[str, str] = ("0", "default_pg"),
          **over: Any) -> dict[str, Any]:  # fmt: skip
    e = {
        "record_id": seq, "pg_id": 0, "process_group": pg, "collective_seq_id": seq,
        "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": NS + seq,
        "input_sizes": [[1024]], "input_dtypes": ["BFloat16"], "output_sizes": [[1024]],
        "output_dtypes": ["BFloat16"], "state": "completed", "retired": True,
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "is_p2p": False, "frames": [{"name": "train", "filename": "t.py", "line": 3}],
    }  # fmt: skip
    e.update(over)
    return e


def nccl_dump(entries: list[dict[str, Any]], groups: dict[str, list[int]]) -> dict[str, Any]:
    config = {n: {"name": n, "desc": "default_pg" if n == "0" else "tp", "ranks": str(r)}
              for n, r in groups.items()}  # fmt: skip
    return {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}


def write(folder: Path, rank: int, doc: dict[str, Any], fmt: str = "pickle") -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / (f"nccl_trace_rank_{rank}" if fmt == "pickle" else f"fr_{rank}.json")
    path.write_bytes(pickle.dumps(doc, protocol=2) if fmt == "pickle" else json.dumps(doc).encode())
    return path


@pytest.mark.timeout(10)
def test_nccl_dumps_with_group_config_and_states(tmp_path: Path) -> None:
    world = {"0": [0, 1, 2, 3], "1": [2, 3]}
    done = [entry(s) for s in (1, 2)]
    hung = entry(3, state="started", retired=False)
    for rank in (0, 1, 2):
        write(tmp_path, rank, nccl_dump([*done, hung], world))
    write(tmp_path, 3, nccl_dump(done, world))  # rank 3 never enters seq 3
    snaps = load_flight_recorder([str(tmp_path)])
    assert snaps is not None
    assert [s.rank for s in snaps] == [0, 1, 2, 3]
    rec = snaps[0].records[-1]
    assert (rec.comm, rec.seq, rec.op, rec.dtype, rec.count, rec.nbytes, rec.state) == (
        "0:0-3",
        3,
        "all_reduce",
        "bfloat16",
        1024,
        2048,
        STARTED,
    )
    assert snaps[0].comms["0:0-3"].ranks == [0, 1, 2, 3]
    diag = diagnose(snaps, options=Options(stuck_after_s=1e-9))
    assert [(v.kind, [s.rank for s in v.suspects], v.seq) for v in diag.verdicts] == [
        (NOT_ENTERED, [3], 3)
    ]


@pytest.mark.timeout(10)
def test_point_to_point_peers_are_mapped_through_the_group(tmp_path: Path) -> None:
    groups = {"0": [0, 1, 2, 3], "1": [2, 3]}
    p2p = entry(1, "nccl:send 0->1", ("1", "tp"), is_p2p=True, p2p_seq_id=1,
                collective_seq_id=0, state="scheduled", retired=False)  # fmt: skip
    write(tmp_path, 2, nccl_dump([p2p], groups))
    (snap,) = load_flight_recorder([str(tmp_path / "nccl_trace_rank_2")]) or []
    (rec,) = snap.records
    assert (rec.comm, rec.op, rec.seq, rec.peer, rec.waiting_on, rec.waiting_for) == (
        "1:2-3",
        "send",
        1,
        3,
        3,
        "send",
    )
    assert snap.comms["1:2-3"].last_started == 0  # point-to-point seqs stay apart


@pytest.mark.timeout(10)
def test_gloo_style_completion_from_pg_status_and_inferred_world(tmp_path: Path) -> None:
    # gloo: state stays "scheduled", pg_config is empty, JSON writes pg_status as strings
    status = {"0": {"last_enqueued_collective": "3", "last_completed_collective": "2"}}
    gloo = [entry(s, "gloo:allreduce", state="scheduled", retired=False) for s in (1, 2, 3)]
    doc = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
           "pg_status": status, "entries": gloo}  # fmt: skip
    for rank in (0, 2):
        write(tmp_path, rank, doc, fmt="json")
    snaps = load_flight_recorder([str(tmp_path)])
    assert snaps is not None
    states = [(r.seq, r.state) for r in snaps[0].records]
    assert states == [(1, COMPLETED), (2, COMPLETED), (3, STARTED)]
    assert snaps[0].world_size == 3  # ranks 0 and 2 seen: the default group spans 0-2
    kinds = {v.kind for v in diagnose(snaps, options=Options(stuck_after_s=1e-9)).verdicts}
    assert MISSING in kinds  # rank 1 left no dump


@pytest.mark.timeout(10)
def test_the_ring_is_cut_to_its_tail_but_progress_is_kept(tmp_path: Path) -> None:
    many = [entry(s) for s in range(1, 2001)]
    write(tmp_path, 0, nccl_dump(many, {"0": [0]}))
    (snap,) = load_flight_recorder([str(tmp_path)]) or []
    assert len(snap.records) == 16
    assert snap.records[-1].seq == 2000
    assert (snap.comms["0:0"].last_started, snap.comms["0:0"].last_completed) == (2000, 2000)


class _Boom:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return (os.system, ("touch pwned",))


@pytest.mark.timeout(10)
def test_a_pickle_that_would_run_code_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "nccl_trace_rank_0"
    evil.write_bytes(pickle.dumps({"version": "2.10", "entries": [_Boom()]}, protocol=2))
    with pytest.raises(BadInput, match=r"refusing to load \w+\.system"):
        load_flight_recorder([str(evil)])
    assert not (tmp_path / "pwned").exists()


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("nccl_trace_rank_0", b"\x80\x02}q\x00(X\x07\x00\x00", "truncated"),
        ("trace_of_rank_zero", pickle.dumps({"entries": []}, protocol=2), "which rank"),
        ("nccl_trace_rank_1", pickle.dumps({"entries": [[1]]}, protocol=2), "entry 0 is not"),
        ("fr_1.json", b'{"entries": {"x": 1}}', "'entries' is not a list"),
        ("fr_2.json", b'{"pg_config": {}, "entries": [{"collective_seq_id": "7"}]}', "sequence"),
    ],
)
def test_unusable_dumps_are_named_with_the_reason(
    tmp_path: Path, name: str, data: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(BadInput, match=message) as caught:
        load_flight_recorder([str(path)])
    assert str(path) in str(caught.value)


@pytest.mark.timeout(10)
def test_other_files_are_left_to_the_cclctl_reader(tmp_path: Path) -> None:
    cclctl = tmp_path / "cclctl-job-rank0.json"
    cclctl.write_text('{"schema":"cclctl.dump","version":1,"entries":[]}')
    (tmp_path / "notes.txt").write_text("hello")
    assert load_flight_recorder([str(tmp_path)]) is None
    assert load_flight_recorder([str(cclctl)]) is None
    write(tmp_path / "fr", 0, nccl_dump([entry(1)], {"0": [0]}))
    with pytest.raises(BadInput, match="one kind of dump"):
        load_flight_recorder([str(tmp_path / "fr" / "nccl_trace_rank_0"), str(cclctl)])


def test_sniffing_tells_pickle_json_and_cclctl_apart() -> None:
    assert sniff(pickle.dumps({}, protocol=2)) == "pickle"
    assert sniff(b' {"version": "2.10", "pg_config": {}}') == "json"
    assert sniff(b'{"schema":"cclctl.dump","entries":[]}') is None
    assert sniff(b"\x80\x09") is None  # no such pickle protocol
