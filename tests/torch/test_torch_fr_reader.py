"""The Flight Recorder reader on hand-made dumps: the formats NCCL writes (group config,
``state`` updates, point-to-point names), a hostile pickle, and input that is not a dump.
Real gloo dumps are covered in test_torch_fr.py.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import MISSING, NOT_ENTERED, Options
from cclctl.diagnose_io import flight_recorder as torch_fr
from cclctl.diagnose_io import fr_pool as torch_fr_pool
from cclctl.diagnose_io.flight_recorder import find_dumps, load_flight_recorder, read_dump, sniff
from cclctl.diagnose_io.fr_translate import RankDump
from cclctl.errors import BadInput
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
    mixed = load_flight_recorder([str(tmp_path / "fr" / "nccl_trace_rank_0"), str(cclctl)])
    assert [s.rank for s in mixed or []] == [0]  # the cclctl dump is its own reader's


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickles_are_read_ahead_not_opcode_by_opcode(
    monkeypatch: pytest.MonkeyPatch, protocol: int
) -> None:
    # torch writes protocol 2, which has no frames: read() per opcode was 3.5x slower
    doc = nccl_dump([entry(s) for s in range(1, 1001)], {"0": [0, 1]})
    data = pickle.dumps(doc, protocol=protocol)
    calls: list[int] = []
    read = torch_fr._Peekable.read

    def counted(self: torch_fr._Peekable, size: int | None = -1) -> bytes:
        calls.append(size or 0)
        return read(self, size)

    monkeypatch.setattr(torch_fr._Peekable, "read", counted)
    assert torch_fr.parse(data, "pickle", "p") == pickle.loads(data)
    assert len(calls) < 10 + 4 * len(data) // (1 << 17)
    with pytest.raises(BadInput, match="truncated"):
        torch_fr.parse(data[: len(data) // 2], "pickle", "p")


@pytest.mark.timeout(10)
def test_groups_named_every_way_a_dump_names_them(tmp_path: Path) -> None:
    # process_group as a tuple (pickle) or list (JSON), a non-text name, or only pg_id
    ring = [entry(1), entry(1, pg=(7, "tp")), entry(2, pg=None, pg_id=5)]  # type: ignore[arg-type]
    for rank, fmt in ((0, "pickle"), (1, "json")):
        write(tmp_path, rank, nccl_dump(ring, {"0": [0, 1]}), fmt=fmt)
    snaps = load_flight_recorder([str(tmp_path)])
    assert snaps is not None
    for snap in snaps:
        assert sorted((r.comm, r.seq) for r in snap.records) == [("0:0-1", 1), ("5:0-1", 2),
                                                                 ("7:0-1", 1)]  # fmt: skip


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("ring", "message"),
    [
        ([entry(1), [1], entry(3), "x"], "entry 3 is not a mapping"),  # the newest bad one
        ([entry(1), entry(2, collective_seq_id=True), entry(3)], "entry 1 has no integer seq"),
        ([entry(1, is_p2p=True, p2p_seq_id=None)], "entry 0 has no integer seq"),
    ],
)
def test_a_bad_entry_is_named_by_its_place_in_the_ring(
    tmp_path: Path, ring: list[Any], message: str
) -> None:
    path = write(tmp_path, 0, nccl_dump(ring, {"0": [0]}))
    with pytest.raises(BadInput, match=message):
        load_flight_recorder([str(path)])


def _many(folder: Path, ranks: int) -> list[tuple[str, str]]:
    world = {"0": list(range(ranks)), "1": [0, 1]}
    for rank in range(ranks):
        ring = [entry(s) for s in range(1, 30 + rank)]
        ring.insert(5, entry(1, "nccl:send 0->1", ("1", "tp"), is_p2p=True, p2p_seq_id=1,
                             state="scheduled", retired=False))  # fmt: skip
        ring.append(entry(30 + rank, state="started", retired=False))
        write(folder, rank, nccl_dump(ring, world))
    return find_dumps([str(folder)]) or []


@pytest.mark.timeout(20)
def test_forked_readers_give_what_one_process_gives(tmp_path: Path) -> None:
    files = _many(tmp_path, torch_fr_pool.MIN_FILES + 3)
    one = torch_fr_pool.read_all(files, read_dump, workers=1)
    forked = torch_fr_pool.read_all(files, read_dump, workers=3)
    assert sorted(map(_seen, forked)) == sorted(map(_seen, one))
    assert {len(g.records) for d in one for g in d.groups.values()} == {1, 17}  # cut to 16+1


def _seen(d: RankDump) -> str:
    """What a diagnosis reads of a condensed dump (not the counters used while reading)."""
    groups = {n: (g.desc, g.started, g.completed, g.records) for n, g in d.groups.items()}
    return repr((d.path, d.rank, d.fmt, d.version, d.time_ns, d.entries, d.members, groups))


@pytest.mark.timeout(20)
def test_forked_readers_name_the_first_bad_file(tmp_path: Path) -> None:
    files = _many(tmp_path, torch_fr_pool.MIN_FILES)
    for rank in (20, 7):
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(b"\x80\x02}q\x00(X\x07")
    with pytest.raises(BadInput, match="truncated") as caught:
        torch_fr_pool.read_all(files, read_dump, workers=2)
    assert caught.value.fields["path"] == str(tmp_path / "nccl_trace_rank_20")  # by path


@pytest.mark.timeout(20)
def test_one_reader_per_cpu_this_process_may_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert torch_fr_pool.cores() == 3
    files = _many(tmp_path, torch_fr_pool.MIN_FILES)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2}, raising=False)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked with one CPU"))
    assert len(torch_fr_pool.read_all(files, read_dump)) == len(files)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_until_the_dump_is_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    path = write(tmp_path, 0, nccl_dump([entry(1)], {"0": [0]}))
    seen: list[bool] = []
    condense = torch_fr.read_rank

    def spy(*args: Any) -> Any:
        seen.append(gc.isenabled())
        return condense(*args)

    monkeypatch.setattr(torch_fr, "read_rank", spy)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        read_dump(str(path), "pickle")
        assert (seen, gc.isenabled()) == ([False], enabled)
    finally:
        (gc.enable if was else gc.disable)()


def test_sniffing_tells_pickle_json_and_cclctl_apart() -> None:
    assert sniff(pickle.dumps({}, protocol=2)) == "pickle"
    assert sniff(b' {"version": "2.10", "pg_config": {}}') == "json"
    assert sniff(b'{"schema":"cclctl.dump","entries":[]}') is None
    assert sniff(b"\x80\x09") is None  # no such pickle protocol


@pytest.mark.timeout(20)
@pytest.mark.parametrize("files", [1, torch_fr_pool.MIN_FILES])
def test_a_number_too_long_to_print_is_bad_input_naming_the_file(
    tmp_path: Path, files: int
) -> None:
    """Python refuses str() of an int past 4,300 digits: a hostile or corrupt dump with one
    must be BadInput naming the file, read here or by a forked reader (which used to die)."""
    for rank in range(files):
        ring = [entry(1), entry(2, name=10**5000 if rank == files - 1 else "nccl:all_reduce")]
        write(tmp_path, rank, nccl_dump(ring, {"0": list(range(files))}))
    with pytest.raises(BadInput, match=rf"nccl_trace_rank_{files - 1}: malformed"):
        load_flight_recorder([str(tmp_path)])
