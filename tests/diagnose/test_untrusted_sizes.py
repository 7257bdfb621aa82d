"""Sizes stated by input never decide what ``diagnose`` and ``top`` allocate.

Every command runs as a subprocess under a 1 GiB address-space limit, so a reader that
allocated by a forged number would fail (MemoryError, exit 1) instead of passing slowly:
the refusal is exit 2 with one line naming the input and the limit.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from diagnose_factory import Job

from cclctl.limits import MAX_FILE_BYTES
from cclctl.store.client import StoreClient, StoreServer

EXIT_USAGE = 2
LIMIT_AS = 1 << 30
_UNDER_LIMIT = (
    "import resource, runpy, sys\n"
    f"resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_AS}, {LIMIT_AS}))\n"
    "sys.argv = ['cclctl', *sys.argv[1:]]\n"
    "runpy.run_module('cclctl', run_name='__main__', alter_sys=True)\n"
)


def cclctl(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child that cannot map more than 1 GiB."""
    cmd = [sys.executable, "-c", _UNDER_LIMIT, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def refused(out: subprocess.CompletedProcess[str], *words: str) -> None:
    assert out.returncode == EXIT_USAGE, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("cclctl: error: "), out.stderr
    for word in words:
        assert word in out.stderr


def a_dump(**fields: Any) -> dict[str, Any]:
    doc = json.loads(Job(2).snapshots()[0].to_json())
    doc.update(fields)
    return doc


def test_a_dump_claiming_a_billion_ranks_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cclctl-j1-rank0.json").write_text(json.dumps(a_dump(world_size=10**9)))
    refused(
        cclctl("diagnose", "hang", str(tmp_path)),
        "cclctl-j1-rank0.json: world size 1,000,000,000 is over the limit of 131,072 ranks",
    )


def test_members_beyond_the_limit_are_refused_unexpanded(tmp_path: Path) -> None:
    comms = {"0:0-1": {"ranks": "0-999999999", "last_started": 10, "last_completed": 10}}
    (tmp_path / "cclctl-j1-rank0.json").write_text(json.dumps(a_dump(comms=comms)))
    refused(cclctl("diagnose", "hang", str(tmp_path)), "has members '0-999999999'")


def test_a_world_size_flag_beyond_the_limit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cclctl-j1-rank0.json").write_text(json.dumps(a_dump()))
    refused(
        cclctl("diagnose", "hang", "--world-size", "5000000", str(tmp_path)),
        "--world-size 5000000 is over the limit",
    )


@pytest.mark.parametrize("where", ["world_size", "key", "rendezvous"])
def test_a_forged_live_status_is_refused_by_top_and_diagnose(where: str) -> None:
    with StoreServer() as srv, StoreClient(srv.host, srv.port, connect_timeout_s=5) as client:
        rank, doc = 0, json.loads(Job(2).snapshots("status")[0].to_json())
        if where == "world_size":
            doc["world_size"] = 5 * 10**6
        elif where == "key":
            rank = doc["rank"] = 5 * 10**6 - 1
            doc["world_size"] = 5 * 10**6
        else:
            client.set("cclctl/j1/rdzv/world_size", json.dumps({"world_size": 5 * 10**6}).encode())
        client.set(f"cclctl/j1/status/{rank}", json.dumps(doc).encode())
        for args in (("diagnose", "hang"), ("top", "--json")):
            out = cclctl(*args, "--store", srv.address)
            refused(out, "over the limit of 131,072 ranks")
            assert ("5,000,000" if where != "key" else "4,999,999") in out.stderr


def test_a_huge_sparse_flight_recorder_dump_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    with open(path, "wb") as fh:  # a pickle's first bytes, then a gigabyte of nothing
        fh.write(pickle.dumps({"entries": []}, protocol=2)[:2])
        fh.truncate(1 << 30)
    refused(
        cclctl("diagnose", "hang", str(path)),
        "1,073,741,824 bytes, too large for a Flight Recorder dump",
    )


def test_a_sparse_file_under_the_size_limit_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "cclctl-j1-rank0.json"
    with open(path, "wb") as fh:
        fh.write(b'{"schema": "cclctl.dump", ')
        fh.truncate(MAX_FILE_BYTES // 2)
    out = cclctl("diagnose", "hang", str(tmp_path))
    if "sparse" not in out.stderr:  # a file system without holes stores the zeros
        pytest.skip(f"{tmp_path} keeps no holes in files")
    refused(out, "a sparse file (134,217,728 bytes, a hole at byte 4,096), not a dump")


def test_flight_recorder_members_beyond_the_limit_are_refused(tmp_path: Path) -> None:
    doc = {"version": "2.4", "pg_config": {"0": {"name": "0", "ranks": "[0, 140000]"}}}
    doc["entries"] = []
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(doc, protocol=2))
    refused(cclctl("diagnose", "hang", str(tmp_path)), "a process group member 140,000")


def test_a_rank_number_beyond_the_limit_in_a_flight_recorder_name(tmp_path: Path) -> None:
    doc = {"version": "2.4", "pg_config": {}, "entries": []}
    (tmp_path / "nccl_trace_rank_999999999999").write_bytes(pickle.dumps(doc, protocol=2))
    refused(cclctl("diagnose", "hang", str(tmp_path)), "the rank in its name")


def test_folded_members_cannot_expand_past_a_documents_share(tmp_path: Path) -> None:
    """A few bytes of ``0-131071`` per communicator would otherwise be 128 Ki ranks each."""
    comms = {f"{i}:x": {"ranks": f"0-{131071 - i}", "last_started": 0} for i in range(64)}
    (tmp_path / "cclctl-j1-rank0.json").write_text(json.dumps(a_dump(comms=comms)))
    refused(cclctl("diagnose", "hang", str(tmp_path)), "name over 524,288 members in all")


def test_many_statuses_cannot_expand_past_one_reads_share() -> None:
    with StoreServer() as srv, StoreClient(srv.host, srv.port, connect_timeout_s=5) as client:
        for rank in range(24):  # each within its own share, all of them together beyond
            doc = json.loads(Job(24).snapshots("status")[rank].to_json())
            doc["comms"] = {"0:x": {"ranks": f"0-{131071 - rank}"}}
            client.set(f"cclctl/j1/status/{rank}", json.dumps(doc).encode())
        out = cclctl("top", "--json", "--store", srv.address)
        refused(out, "the statuses name over 2,097,152 communicator members in all")


def _revoke(**fields: Any) -> dict[str, Any]:
    record = {"schema": "cclctl.revoke", "version": 1, "kind": "died", "origin": 1}
    record.update({"reason": "SIGKILL", "seen_by": 0, **fields})
    return record


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"world_size": -5}, "world size -5 is not a world size (1 or more)"),
        ({"world_size": 0}, "world size 0 is not a world size (1 or more)"),
        ({"revoke": _revoke(origin=10**12)}, "field 'origin' is 1000000000000, not a rank"),
        ({"revoke": _revoke(origin=3)}, "field 'origin' is rank 3, outside world size 2"),
        ({"revoke": _revoke(seen_by=-7)}, "field 'seen_by' is -7, not a rank"),
        ({"revoke": _revoke(peer=140_000)}, "field 'peer' is 140000, not a rank"),
        ({"revoke": _revoke(pid=-1)}, "field 'pid' is -1, outside 0 to 2**63-1"),
        ({"time_ns": 10**4000}, "field 'time_ns' does not fit 64 bits (4001 digits)"),
        ({"text": 7 * 10**4999}, "not valid JSON (Exceeds the limit (4300 digits)"),
    ],
)
def test_untrusted_numbers_in_a_dump_are_refused_in_one_line(
    tmp_path: Path, fields: dict[str, Any], said: str
) -> None:
    sys.set_int_max_str_digits(0)  # to write them; the reader keeps Python's default
    try:
        text = json.dumps(a_dump(**fields))
    finally:
        sys.set_int_max_str_digits(4300)
    (tmp_path / "cclctl-j1-rank0.json").write_text(text)
    refused(cclctl("diagnose", "hang", str(tmp_path)), "cclctl-j1-rank0.json", said)


def test_a_record_number_beyond_64_bits_is_refused(tmp_path: Path) -> None:
    doc = a_dump()
    doc["records"][0]["start_ns"] = 10**300
    (tmp_path / "cclctl-j1-rank0.json").write_text(json.dumps(doc))
    refused(cclctl("diagnose", "hang", str(tmp_path)), "field 'start_ns' does not fit 64 bits")
