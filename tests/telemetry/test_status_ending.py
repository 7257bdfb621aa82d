"""How a rank's process ended is a field of its documents (``ending``), which the readers
go by; a document from before the field says it only in its reason, and still reads."""

from __future__ import annotations

import json

from cclctl.diagnose.view import rank_state
from cclctl.endings import ENDING_TERMINATED, ENDING_UNCAUGHT
from cclctl.records import snapshot_from_dict, snapshot_from_json


def test_a_rank_that_ends_other_than_cleanly_publishes_how(make_tel) -> None:
    tel = make_tel()
    assert snapshot_from_json(tel.snapshot("status").to_json()).ending == ""
    assert "ending" not in tel.snapshot("status").to_dict()  # add-only: absent while it runs

    tel.exit_reason = "terminated by SIGTERM"
    status = snapshot_from_json(tel.snapshot("status").to_json())
    assert (status.ending, status.reason) == (ENDING_TERMINATED, "terminated by SIGTERM")
    dump = tel.snapshot("dump", "uncaught RuntimeError: boom")
    assert snapshot_from_json(dump.to_json()).ending == ENDING_UNCAUGHT
    assert tel.snapshot("dump", "revoked").ending == ""


def test_the_readers_go_by_the_field_not_the_reason_s_words(make_tel) -> None:
    doc = make_tel().snapshot("status").to_dict()
    doc.update(reason="stopped by its launcher (SIGTERM)", ending=ENDING_TERMINATED)
    state = rank_state(snapshot_from_dict(doc))
    assert state.ended == "stopped by its launcher (SIGTERM)"

    doc.update(reason="terminated by the look of it", ending="")
    assert rank_state(snapshot_from_dict(doc)).ended == ""


def test_a_document_from_before_the_field_still_says_how_it_ended(make_tel) -> None:
    doc = make_tel().snapshot("status").to_dict()
    doc.pop("ending", None)
    doc["reason"] = "uncaught RuntimeError: [gloo] Connection closed by peer"
    old = snapshot_from_json(json.dumps(doc))
    assert old.ending == ENDING_UNCAUGHT
    assert rank_state(old).ended == doc["reason"]

    doc["reason"] = "closed"
    assert snapshot_from_json(json.dumps(doc)).ending == ""
