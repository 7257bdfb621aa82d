"""Revoke records carry the facts their readers act on as fields (add-only): the calls of a
mismatch and why a rank could not retry; readers take the fields, not the words."""

from __future__ import annotations

from cclctl import revocation
from cclctl.commands.retry import _aborted
from cclctl.live.snapshot import JobStatuses
from cclctl.records import RankSnapshot
from cclctl.revocation import OPERATOR, Revocation


def _status(rank: int, rev: Revocation) -> RankSnapshot:
    return RankSnapshot("status", "j", rank, 2, "vm", 10 + rank, 1, revoke=rev)


def test_the_facts_travel_with_the_record_and_older_records_read_them_empty():
    rev = Revocation("mismatch", 2, "called b", seen_by=1, peer=1, called="b(x)", peer_called="a")
    back = revocation.decode(rev.encode())
    assert (back.called, back.peer_called, back.not_retried) == ("b(x)", "a", "")
    older = {k: v for k, v in rev.to_dict().items() if k not in ("called", "peer_called")}
    assert revocation.from_dict(older).called == ""


def test_retry_reads_why_a_rank_could_not_retry_from_its_field_not_its_words():
    asked = Revocation("retry", OPERATOR, "", via="operator")
    refused = asked.replace(kind="aborted", reason="reworded entirely", not_retried="no TCP")
    other = asked.replace(kind="aborted", reason="retry asked, but the words say so")
    statuses = JobStatuses("j", "a", 1, {0: _status(0, refused), 1: _status(1, other)})
    assert _aborted(statuses, 2) == {0: "no TCP"}
