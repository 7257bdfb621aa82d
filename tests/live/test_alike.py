"""Ranks that are alike parsed once (cclctl/status_digest.py, cclctl/live/alike.py): a host
agent's summary gives each plain status a digest, and a reader that makes alike ranks from
one model per key reaches the same diagnosis as one that parses every status."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

import pytest
from alike_job import (
    JOB,
    NOW,
    NS,
    SEQ,
    host_of,
    job_listing,
    job_statuses,
    rank_status,
    rewrite_host,
)

from cclctl.diagnose_io.live import diagnose_live
from cclctl.live import snapshot
from cclctl.live.alike import ALIKE_FROM
from cclctl.records import RankSnapshot
from cclctl.revocation import Revocation
from cclctl.stack_records import ThreadStack
from cclctl.status_digest import KEY_CHARS, TEXT_CHARS, checked, digest


def _both(listing: dict[str, bytes]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The diagnosis from every status parsed, and from alike ranks made from models."""
    out = []
    for alike_from in (None, 0):
        statuses = snapshot.parse(JOB, "addr", listing, alike_from=alike_from)
        statuses.fetched_ns = NOW + NS
        out.append(diagnose_live(statuses).to_dict())
    return out[0], out[1]


@pytest.mark.parametrize("planted", [0, 13, 31])
def test_a_rank_that_never_entered_is_named_alike_from_one_model_per_kind(planted) -> None:
    full, made = _both(job_listing(job_statuses(32, **{str(planted): {"seq": 0}})))
    assert made == full
    assert full["verdicts"][0]["kind"] == "not_entered"
    assert [s["rank"] for s in full["verdicts"][0]["suspect_ranks"]] == [planted]


def test_a_mismatched_call_and_a_stale_rank_read_the_same() -> None:
    snaps = job_statuses(24, **{"5": {"op": "broadcast"}})
    snaps[17] = dataclasses.replace(snaps[17], time_ns=NOW - 90 * NS)
    full, made = _both(job_listing(snaps))
    assert made == full
    kinds = {v["kind"] for v in full["verdicts"]}
    assert "mismatch" in kinds and "stale" in kinds


def test_ranks_that_are_not_plain_are_parsed_in_full_beside_alike_ones() -> None:
    revoke = Revocation("hang", 3, "rank 3 never entered", comm="0:0-15", seq=SEQ)
    snaps = job_statuses(16, **{"3": {"seq": 0}, "9": {"revoke": revoke},
                        "10": {"stacks": [ThreadStack("MainThread", [])]},
                        "11": {"counters": {"errors": 1}}})  # fmt: skip
    full, made = _both(job_listing(snaps))
    assert made == full


def test_a_healthy_job_and_a_broken_status_read_the_same() -> None:
    snaps = {r: rank_status(r, 16, seq=0) for r in range(16)}  # every rank between calls
    listing = job_listing(snaps, texts={6: "{not json"})
    full, made = _both(listing)
    assert made == full
    assert full["verdicts"][0]["kind"] != "not_entered"


def test_a_model_whose_status_does_not_match_its_digest_is_not_a_model() -> None:
    snaps = job_statuses(16, **{"7": {"seq": 0}})
    odd = dataclasses.replace(snaps[0], records=snaps[0].records[:1], inflight=None)
    full, made = _both(job_listing(snaps, texts={0: odd.to_json()}))
    assert made == full  # rank 0 as it says; rank 1 the model of the others


@pytest.mark.parametrize(
    "odd", [{"rank": 7}, {"pid": 1 << 64}, {"time_ns": 1 << 64}, {"world_size": 6}]
)
def test_a_status_whose_own_numbers_a_reader_refuses_is_read_the_same(odd) -> None:
    """Rank 6 says it is another rank, or has a pid or a clock beyond 64 bits, or a world
    its rank is outside: it gets no digest, so it is parsed in full and refused both ways
    (a rank made from a model would have its key's rank and its digest's numbers)."""
    snaps = job_statuses(16, **{"3": {"seq": 0}})
    listing = job_listing(snaps)
    doc = rewrite_host(listing, host_of(6), lambda r, status: status | odd if r == 6 else status)
    assert "6" not in doc.summary["digests"] and "5" in doc.summary["digests"]
    full, made = _both(listing)
    assert made == full


def test_digests_differ_only_where_the_ranks_do() -> None:
    a, b = _digest(rank_status(2, 8)), _digest(rank_status(5, 8))
    assert a is not None and b is not None
    assert a[2] == b[2] and len(a[2]) == KEY_CHARS
    assert a[:2] == [1002, NOW - 2000] and a[3] == [NOW - 30 * NS - 2000, 2, 1, "recv"]
    assert a[4] != b[4] and len(a[4]) == TEXT_CHARS
    assert _digest(rank_status(2, 8, op="broadcast"))[2] != a[2]
    assert _digest(rank_status(2, 8, seq=0))[3] is None


def _digest(snap: RankSnapshot) -> list[Any]:
    text = snap.to_json()
    row = digest(json.loads(text), text)
    assert row is not None
    return row


@pytest.mark.parametrize(
    "change",
    [
        {"finished": True},
        {"reason": "closed"},
        {"ending": "uncaught"},
        {"counters": {"retries": 2}},
        {"stacks": [{"name": "MainThread", "frames": []}]},
        {"revoke": {"kind": "dead", "origin": 1}},
        {"pid": -1},
        {"schema": "cclctl.dump"},
    ],
)
def test_a_status_that_could_be_the_answer_gets_no_digest(change) -> None:
    doc = rank_status(2, 8).to_dict()
    doc.update(change)
    assert digest(doc) is None


def test_a_record_with_an_error_or_a_peer_gets_no_digest() -> None:
    for change in ({"error": "reset"}, {"peer": 3}, {"state": "failed"}):
        doc = rank_status(2, 8).to_dict()
        doc["records"][0].update(change)
        assert digest(doc) is None


K, T = "k" * KEY_CHARS, "t" * TEXT_CHARS


@pytest.mark.parametrize(
    "row",
    [None, [], [1, 2, K, None], [1, -2, K, None, T], [1, 2, "short", None, T],
     [1, 2, K, None, "short"], [1, 2, K, [1, 2, 3], T], [1, 2, K, [1, 0, -3, "recv"], T],
     [1, 2, K, [1, 0, 3, "sideways"], T], [True, 2, K, None, T]],
)  # fmt: skip
def test_a_digest_without_the_shape_is_none(row) -> None:
    assert checked(row) is None
    assert checked([1, 2, K, [1, 0, 3, "recv"], T]) is not None


@pytest.mark.timeout(120)
def test_diagnose_hang_store_names_the_rank_of_a_large_job_as_top_does(server, client) -> None:
    n, planted = ALIKE_FROM, 600
    now = time.time_ns()
    snaps = job_statuses(n, now, **{str(planted): {"seq": 0}})
    for key, value in job_listing(snaps, now=now).items():
        client.set(key, value)
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", "--store", server.address,
           "--job", JOB, "--json"]  # fmt: skip
    hang = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert hang.returncode != 0 and hang.stdout, hang.stderr  # a fault found
    verdict = json.loads(hang.stdout)["verdicts"][0]
    assert verdict["kind"] == "not_entered"
    assert [s["rank"] for s in verdict["suspect_ranks"]] == [planted]
    top = [sys.executable, "-m", "cclctl", "top", "--store", server.address, "--json"]
    doc = json.loads(subprocess.run(top, capture_output=True, text=True, timeout=100).stdout)
    assert doc["diagnosis"]["verdicts"][0] == verdict  # top parses every status
