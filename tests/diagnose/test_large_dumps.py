"""Large and hostile dumps: read in pieces (memory follows what is kept, not the file), and
untrusted numbers in them refused in one line."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from test_diagnose_inputs import SIDE, hub_dump

from cclctl.diagnose_io import dump_layout, dumpfile
from cclctl.diagnose_io.dumpfile import TAIL, read_dump
from cclctl.errors import BadInput
from cclctl.records import snapshot_from_json


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file counts as large and is read in 4 KiB pieces (records straddle them)."""
    monkeypatch.setattr(dumpfile, "WHOLE_BYTES", 1024)
    monkeypatch.setattr(dump_layout, "CHUNK", 4096)


def test_a_large_dump_read_in_pieces_keeps_what_the_full_parse_keeps(
    tmp_path: Path, small_pieces: None
):
    path = hub_dump(tmp_path)
    full = snapshot_from_json(path.read_bytes())
    got = read_dump(str(path))
    assert got.records == [full.records[0], *full.records[-TAIL:]]
    assert got.records[0].comm == SIDE
    assert (got.comms, got.inflight, got.counters, got.stacks) == (
        full.comms, full.inflight, full.counters, full.stacks,
    )  # fmt: skip


def test_memory_follows_the_tail_not_the_file(tmp_path: Path):
    path = hub_dump(tmp_path, records=30_000)  # about 10 MB: over WHOLE_BYTES
    size = path.stat().st_size
    assert size > dumpfile.WHOLE_BYTES
    tracemalloc.start()
    try:
        snap = read_dump(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(snap.records) == TAIL + 1
    assert peak < size / 4, f"peak {peak:,} bytes for a {size:,}-byte dump"


def test_a_truncated_large_dump_says_so(tmp_path: Path, small_pieces: None):
    data = hub_dump(tmp_path).read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput) as err:
        read_dump(str(cut))
    assert err.value.message == f"{cut}: {dump_layout.TRUNCATED}"


def test_a_bad_record_in_a_large_dump_is_named_by_its_index_in_the_ring(
    tmp_path: Path, small_pieces: None
):
    path = hub_dump(tmp_path)
    doc = json.loads(path.read_bytes())
    doc["records"][-3]["seq"] = "nine"
    path.write_text(json.dumps(doc, separators=(",", ":")))
    with pytest.raises(BadInput) as err:
        read_dump(str(path))
    index = len(doc["records"]) - 3
    why = "field 'seq' must be an integer, got 'nine'"
    assert err.value.message == f"{path}: record {index}: {why}"


def test_a_large_file_in_another_layout_is_refused_unparsed(tmp_path: Path, small_pieces: None):
    path = hub_dump(tmp_path)
    path.write_text(json.dumps(json.loads(path.read_bytes()), indent=1))
    with pytest.raises(BadInput) as err:
        read_dump(str(path))
    assert "not a dump in cclctl's layout" in err.value.message


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("field", ["time_ns", "pid"])
def test_an_integer_of_thousands_of_digits_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, large: bool, field: str
):
    if large:
        monkeypatch.setattr(dumpfile, "WHOLE_BYTES", 1024)
    path = hub_dump(tmp_path, records=200)
    text = path.read_text()
    doc = json.loads(text)
    path.write_text(text.replace(f'"{field}":{doc[field]}', f'"{field}":{"7" * 5000}', 1))
    with pytest.raises(BadInput) as err:
        read_dump(str(path))
    assert err.value.message.startswith(f"{path}: not valid JSON (Exceeds the limit")
    assert "\n" not in err.value.message
