"""The errors the runtime raises carry their call's facts as fields, read into a record's
``fault`` (:func:`cclctl.call_fault.fault_of`) without reading their words."""

from __future__ import annotations

import pytest

from cclctl.call_fault import CallFault, fault_of
from cclctl.errors import CclError, CollectiveTimeout, CommRevoked, ProtocolError
from cclctl.revocation import Revocation
from cclctl.runtime import failure_errors
from cclctl.runtime.transport import wire


def test_a_mismatch_names_the_peer_and_both_calls():
    mine = wire.Call(comm=1, epoch=0, seq=2, op="broadcast", dtype="float64", root=0, count=8)
    theirs = wire.Call(comm=1, epoch=0, seq=2, op="broadcast", dtype="float32", root=0, count=8)
    with pytest.raises(ProtocolError) as info:
        wire.check(wire.Header(theirs, 0, 64), mine, 0, 64, rank=2, peer=0)
    assert fault_of(info.value) == CallFault(
        "mismatch", peer=0, mine=mine.what(), theirs=theirs.what(), their_seq=2
    )


def test_another_step_of_the_same_call_is_no_claim_about_the_peers_call():
    call = wire.Call(comm=1, epoch=0, seq=2, op="all_reduce", dtype="float32", count=8)
    with pytest.raises(ProtocolError) as info:
        wire.check(wire.Header(call, 1, 32), call, 0, 32, rank=2, peer=0)
    assert fault_of(info.value) == CallFault("step_mismatch", peer=0)


def test_a_timeout_names_whom_it_waited_on():
    with pytest.raises(CollectiveTimeout) as info:
        failure_errors.timeout_error(1, "all_reduce", 3, 0, "recv", 2.0)
    assert fault_of(info.value) == CallFault("timeout", peer=0, direction="recv")


def test_a_revoked_call_names_the_origin_and_an_abort_names_none():
    rev = Revocation("died", 6, "SIGKILL", seen_by=3)
    exc = failure_errors.revoked("rank 4: all_reduce seq 5", rev, peer=3)
    assert isinstance(exc, CommRevoked)
    assert fault_of(exc) == CallFault("revoked", origin=6)
    aborted = failure_errors.revoked("rank 4: x", rev.replace(kind="aborted"), peer=3)
    assert fault_of(aborted) == CallFault("aborted")


def test_an_error_without_facts_is_an_error():
    assert fault_of(CclError("rank 1: link to rank 0 was dropped", peer=0)).kind == "error"
    assert fault_of(KeyboardInterrupt()) == CallFault("error")
