"""The evidence a rank leaves besides its dumps: a finished document at a clean close (and
only then), the revoke record in every later document, and no earlier run's files."""

from __future__ import annotations

import os
from pathlib import Path

from telemetry_helpers import DictStore, run

from cclctl.diagnose_io.dumpfile import read_dump
from cclctl.diagnose_io.inputs import load_dumps
from cclctl.records import FAILED, snapshot_from_json
from cclctl.revocation import Revocation


def _status(store: DictStore, rank: int = 0):
    raw = store.get(f"status/{rank}")
    assert raw is not None
    return snapshot_from_json(raw)


def test_a_clean_close_leaves_a_finished_document_and_status(make_tel, tmp_path):
    tel = make_tel(rank=1, world_size=2, trace_dir=str(tmp_path))
    tel.register_comm("w", [0, 1])
    done = [run(tel, "w", seq) for seq in (1, 2, 3)]
    store = DictStore()
    tel.publish_to(store, interval_s=60)

    path = tel.finish()

    assert path == str(tmp_path / "cclctl-job1-rank1.json")
    doc = read_dump(path)  # the reader diagnose hang uses
    assert (doc.kind, doc.finished, doc.reason, doc.rank) == ("status", True, "finished", 1)
    assert doc.records == [done[-1]] and doc.stacks == []
    assert doc.counters["collectives"] == 3 and doc.counters["errors"] == 0
    last = _status(store, 1)
    assert last.finished and last.reason == "closed"
    assert tel.finish() is None  # once


def test_a_close_after_a_failed_call_is_not_finished(make_tel, tmp_path):
    tel = make_tel(trace_dir=str(tmp_path))
    run(tel, "w", 1, state=FAILED)
    store = DictStore()
    tel.publish_to(store, interval_s=60)
    assert tel.finish() is None
    assert os.listdir(tmp_path) == []
    last = _status(store)
    assert not last.finished and last.reason == "closed"


def test_a_close_while_an_exception_leaves_is_not_finished(make_tel, tmp_path):
    tel = make_tel(trace_dir=str(tmp_path))
    run(tel, "w", 1)
    try:
        raise RuntimeError("the training loop broke")
    except RuntimeError:
        assert tel.finish() is None  # as Communicator.__exit__ closes on the way out
    assert os.listdir(tmp_path) == []


def test_an_exit_reason_rides_in_every_later_status_and_is_not_finished(make_tel, tmp_path):
    """A process that knows why it ends (an uncaught error, a SIGTERM: the torch
    integration's hooks set it) says so in its statuses, never "closed" (read as done)."""
    tel = make_tel(trace_dir=str(tmp_path))
    run(tel, "w", 1)
    store = DictStore()
    tel.publish_to(store, interval_s=60)
    tel.exit_reason = "uncaught RuntimeError: Connection closed by peer"
    assert tel.snapshot("status").reason == tel.exit_reason
    assert tel.finish() is None
    assert os.listdir(tmp_path) == []
    last = _status(store)
    assert not last.finished and last.reason == tel.exit_reason


def test_the_revoke_record_rides_in_statuses_and_dumps(make_tel, tmp_path):
    tel = make_tel(rank=2, world_size=4, trace_dir=str(tmp_path))
    run(tel, "w", 1, world_size=4)
    record = Revocation("died", 3, "process exited", host="vm", pid=3630, seen_by=1, via="pidfd")
    tel.revoke = record
    status = tel.snapshot("status")
    assert status.revoke == record and not status.finished
    dumped = read_dump(tel.dump("revoked"))
    assert dumped.revoke == record and dumped.kind == "dump" and not dumped.finished
    assert tel.finish() is None  # a revoked rank did not finish cleanly
    assert read_dump(str(tmp_path / "cclctl-job1-rank2.json")).reason == "revoked"


def test_dumps_with_revoke_and_finished_load_as_one_job(make_tel, tmp_path):
    revoked = make_tel(rank=0, world_size=2, trace_dir=str(tmp_path))
    finished = make_tel(rank=1, world_size=2, trace_dir=str(tmp_path))
    for tel in (revoked, finished):
        run(tel, "w", 1, world_size=2)
    revoked.revoke = Revocation("hang", 1, "called nothing", seen_by=0, via="watchdog")
    revoked.dump("revoked")
    finished.finish()
    (tmp_path / "token").write_text("not-a-dump\n")  # the job's token file lives beside them
    inputs = load_dumps([str(tmp_path)])
    by_rank = {s.rank: s for s in inputs.snapshots}
    assert by_rank[0].revoke is not None and by_rank[0].revoke.origin == 1
    assert by_rank[1].finished and by_rank[1].revoke is None
    assert inputs.files == 2


def test_a_rank_removes_its_own_earlier_document(make_tel, tmp_path):
    for name in ("cclctl-job1-rank0.json", "cclctl-job1-rank1.json", "cclctl-job1-rank5.json"):
        (tmp_path / name).write_text("{}")
    tel = make_tel(rank=1, world_size=4, trace_dir=str(tmp_path))
    assert tel.remove_stale_dumps() == [str(tmp_path / "cclctl-job1-rank1.json")]
    assert sorted(os.listdir(tmp_path)) == ["cclctl-job1-rank0.json", "cclctl-job1-rank5.json"]


def test_rank_0_also_removes_ranks_beyond_this_world(make_tel, tmp_path):
    keep = ["cclctl-job1-rank1.json", "cclctl-job10-rank7.json", "cclctl-job1-rank1-rank9.json"]
    keep += ["token", "cclctl-job1-rankx.json", "nccl_trace_rank_5"]
    gone = ["cclctl-job1-rank0.json", "cclctl-job1-rank4.json", "cclctl-job1-rank12.json"]
    for name in keep + gone:
        (tmp_path / name).write_text("{}")
    tel = make_tel(rank=0, world_size=4, trace_dir=str(tmp_path))
    assert tel.remove_stale_dumps() == sorted(str(tmp_path / n) for n in gone)
    assert sorted(os.listdir(tmp_path)) == sorted(keep)


def test_removing_stale_documents_from_a_missing_folder_is_nothing(make_tel, tmp_path):
    tel = make_tel(trace_dir=str(tmp_path / "not-yet"))
    assert tel.remove_stale_dumps() == []
    assert not Path(tmp_path / "not-yet").exists()
