"""Loading dumps: the tail-only fast path agrees with a full parse; bad files say why."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from diagnose_factory import Job

from cclctl.config import RuntimeConfig
from cclctl.diagnose_io.dumpfile import TAIL, read_dump
from cclctl.diagnose_io.inputs import dump_paths, load_dumps
from cclctl.errors import BadInput
from cclctl.records import COMPLETED, CollectiveRecord, snapshot_from_json
from cclctl.telemetry.hub import Telemetry

WORLD = "0:0-3"
SIDE = "1:0-1"


def hub_dump(directory: Path, rank: int = 0, *, records: int = 2000, job: str = "j1") -> Path:
    """A dump written by the telemetry hub itself: a long world ring, a side communicator
    used once early on, and an all_reduce in flight.
    """
    tel = Telemetry(
        RuntimeConfig(job=job, hostname="node-a", trace_dir=str(directory), trace_buffer=records),
        rank=rank,
        world_size=4,
    )
    try:
        tel.register_comm(WORLD, [0, 1, 2, 3])
        tel.register_comm(SIDE, [0, 1])
        side = CollectiveRecord(SIDE, 1, "broadcast", "int64", 8, 64, root=0, start_ns=10)
        tel.start(side)
        side.state, side.end_ns = COMPLETED, 20
        for seq in range(1, records):
            rec = CollectiveRecord(
                WORLD, seq, "all_reduce", "float32", 256, 1024, start_ns=100 + seq
            )
            tel.start(rec)
            rec.state, rec.end_ns = COMPLETED, 150 + seq
        last = CollectiveRecord(WORLD, records, "all_reduce", "float32", 256, 1024, start_ns=10**6)
        last.waiting_on, last.waiting_for = 3, "recv"
        tel.start(last)
        path = tel.dump("test")
    finally:
        tel.close()
    assert path is not None
    return Path(path)


def test_fast_path_keeps_the_tail_and_each_communicators_last_call(tmp_path: Path):
    path = hub_dump(tmp_path)
    full = snapshot_from_json(path.read_bytes())
    fast = read_dump(str(path))
    assert len(full.records) == 2001
    assert full.records[0].comm == SIDE  # its only call is the oldest record of the ring
    assert fast.records == [full.records[0], *full.records[-TAIL:]]
    assert fast.records[-1].waiting_on == 3
    assert (fast.comms, fast.inflight, fast.counters) == (full.comms, full.inflight, full.counters)


def test_small_dumps_are_read_whole(tmp_path: Path):
    path = hub_dump(tmp_path, records=5)
    assert read_dump(str(path)).records == snapshot_from_json(path.read_bytes()).records


def test_a_dump_in_another_layout_takes_the_full_parse(tmp_path: Path):
    snap = Job(4).enter([0]).snapshot(0)
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps(snap.to_dict(), indent=2))
    assert read_dump(str(path)).records == snap.records


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("fraction", [0.01, 0.5, 0.9999])
def test_truncated_dump(tmp_path: Path, fraction: float):
    data = hub_dump(tmp_path).read_bytes()
    path = write(tmp_path / "cut.json", data[: int(len(data) * fraction)])
    with pytest.raises(BadInput) as err:
        read_dump(path)
    assert (
        err.value.message == f"{path}: truncated JSON (the file ends in the middle of the document)"
    )


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_dump_cut_inside_an_escape_or_a_character_is_truncated(tmp_path, ascii_only) -> None:
    """Wherever the cut lands in a ``\\u2026`` escape (or in the three bytes of the
    character written raw), the reader says the document is cut short."""
    doc = Job(2).enter([0]).snapshot(0).to_dict()
    doc["reason"] = "stuck \u2026 here"
    data = json.dumps(doc, ensure_ascii=ascii_only).encode()
    mark = b"\\u2026" if ascii_only else "\u2026".encode()
    start = data.index(mark)
    for end in range(start + 1, start + len(mark)):
        path = write(tmp_path / f"cut{end}.json", data[:end])
        with pytest.raises(BadInput) as err:
            read_dump(path)
        assert (
            err.value.message
            == f"{path}: truncated JSON (the file ends in the middle of the document)"
        )


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty file"),
        (b"  \n", "empty file"),
        (b"\x7fELF\x02\x01\x01\x00\x00", "binary data, not a JSON dump"),
        (b"\xff\xfe{\xc3(", "binary data, not a JSON dump"),
        (b"hello", "not valid JSON (Expecting value at line 1 column 1)"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (
            b'{"schema": "cclctl.top", "version": 1}',
            "not a cclctl dump or status (schema is 'cclctl.top')",
        ),
        (b'{"schema": "cclctl.dump", "version": 9}', "unsupported cclctl.dump version 9"),
    ],
)
def test_garbage_files_say_why(tmp_path: Path, data: bytes, why: str):
    path = write(tmp_path / "x.json", data)
    with pytest.raises(BadInput) as err:
        read_dump(path)
    assert err.value.message == f"{path}: {why}"


def test_bad_record_deep_in_the_ring_is_named_by_its_real_index(tmp_path: Path):
    doc = Job(4).snapshot(1).to_dict()
    doc["records"][1]["seq"] = "nine"
    path = write(tmp_path / "r.json", json.dumps(doc, separators=(",", ":")).encode())
    with pytest.raises(BadInput) as err:
        read_dump(path)
    assert err.value.message == f"{path}: record 1: field 'seq' must be an integer, got 'nine'"


def test_paths_that_are_not_dumps(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("hi")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = {
        str(empty): "no cclctl dumps (cclctl-<job>-rank<r>.json) in this folder",
        str(tmp_path / "nope"): "no such file or folder",
        str(fifo): "not a regular file",
    }
    for path, why in cases.items():
        with pytest.raises(BadInput) as err:
            dump_paths([path])
        assert err.value.message == f"{path}: {why}"


def save(directory: Path, job: Job, rank: int, name: str | None = None) -> Path:
    path = directory / (name or f"cclctl-{job.job}-rank{rank}.json")
    path.write_text(job.snapshot(rank).to_json())
    return path


def test_folder_reads_only_dump_files_and_shares_member_lists(tmp_path: Path):
    job = Job(4)
    for rank in range(4):
        save(tmp_path, job, rank)
    (tmp_path / "README.txt").write_text("not a dump")
    (tmp_path / ".cclctl-abc.tmp").write_text("{")  # a dump being written
    inputs = load_dumps([str(tmp_path)])
    assert [s.rank for s in inputs.snapshots] == [0, 1, 2, 3]
    assert inputs.files == 4
    lists = {id(s.comms[job.world].ranks) for s in inputs.snapshots}
    assert len(lists) == 1


def test_mixed_jobs_name_the_files(tmp_path: Path):
    for rank in range(3):
        save(tmp_path, Job(4, job="a"), rank)
    save(tmp_path, Job(4, job="b"), 3)
    with pytest.raises(BadInput) as err:
        load_dumps([str(tmp_path)])
    assert err.value.message == (
        "the dumps come from 2 jobs: 'a' (cclctl-a-rank0.json, cclctl-a-rank1.json and 1 more); "
        "'b' (cclctl-b-rank3.json); pass one job's dumps or choose one with --job"
    )
    assert [s.job for s in load_dumps([str(tmp_path)], job="b").snapshots] == ["b"]
    with pytest.raises(BadInput, match="no dump of job 'c' among 4 files"):
        load_dumps([str(tmp_path)], job="c")


def test_duplicate_rank_keeps_the_newest_and_says_so(tmp_path: Path):
    old, new = Job(2), Job(2).enter([1])
    old.stale([1], 100)
    save(tmp_path, new, 1, "b.json")
    save(tmp_path, old, 1, "a.json")
    save(tmp_path, new, 0, "c.json")
    inputs = load_dumps([str(tmp_path / n) for n in ("a.json", "b.json", "c.json")])
    assert [s.rank for s in inputs.snapshots] == [0, 1]
    assert inputs.snapshots[1].inflight is not None
    assert inputs.notes == {1: "2 dumps (a.json, b.json); kept the newest, b.json"}


def test_a_records_attempt_round_trips_and_a_bad_one_is_named(tmp_path: Path):
    """``attempt`` (a retry's run of the seq) is written and read back; one below 1 or not
    an integer is refused naming the record; a document without it (older) reads as 1."""
    job = Job(4).enter([1], 11, epoch=1, attempt=2)
    doc = job.snapshot(1).to_dict()
    assert [r["attempt"] for r in doc["records"]] == [1, 1, 1, 2]
    good = read_dump(write(tmp_path / "g.json", json.dumps(doc).encode()))
    assert [(r.epoch, r.attempt) for r in good.records][-1] == (1, 2)
    del doc["records"][0]["attempt"]
    older = read_dump(write(tmp_path / "o.json", json.dumps(doc).encode()))
    assert older.records[0].attempt == 1
    for bad, why in ((0, "field 'attempt' must be 1 or more, got 0"),
                     ("2", "field 'attempt' must be an integer, got '2'")):  # fmt: skip
        doc["records"][3]["attempt"] = bad
        path = write(tmp_path / "b.json", json.dumps(doc).encode())
        with pytest.raises(BadInput) as err:
            read_dump(path)
        assert err.value.message == f"{path}: record 3: {why}"
