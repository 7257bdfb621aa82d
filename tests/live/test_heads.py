"""Reading a large job through its host agents' heads (cclctl/live/heads.py): the heads
listed, a few documents read whole, and the same diagnosis as parsing every status; where
that cannot be done at low cost, the whole job listed instead."""

from __future__ import annotations

import dataclasses
import json
import os
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

from cclctl import host_status
from cclctl.diagnose_io.live import diagnose_live
from cclctl.errors import StoreError
from cclctl.live import heads, snapshot
from cclctl.live.alike import ALIKE_FROM
from cclctl.revocation import Revocation
from cclctl.stack_records import ThreadStack
from cclctl.store.client import StoreClient, StoreServer

PREFIX = f"cclctl/{JOB}/"


class Store:
    """A store's keys in a dict, with what was asked of it."""

    address = "addr"

    def __init__(self, keys: dict[str, bytes]) -> None:
        self.keys = keys
        self.lists: list[str] = []
        self.reads: list[str] = []

    def list(self, prefix: str) -> dict[str, bytes]:
        self.lists.append(prefix)
        return {k: v for k, v in self.keys.items() if k.startswith(prefix)}

    def try_get(self, key: str) -> bytes | None:
        self.reads.append(key)
        return self.keys.get(key)

    @property
    def listed_whole(self) -> bool:
        return PREFIX in self.lists

    @property
    def read_whole(self) -> list[str]:
        return [k.removeprefix(PREFIX + host_status.KEY) for k in self.reads if "/host/" in k]


def _diagnosis(statuses: snapshot.JobStatuses) -> dict[str, Any]:
    statuses.fetched_ns = NOW + NS
    return diagnose_live(statuses).to_dict()


def _through_heads(listing: dict[str, bytes]) -> tuple[dict[str, Any], Store]:
    store = Store(listing)
    return _diagnosis(snapshot.fetch(store, JOB, alike_from=0)), store


def _every_status(listing: dict[str, bytes]) -> dict[str, Any]:
    return _diagnosis(snapshot.parse(JOB, "addr", listing))


def _scenarios() -> dict[str, dict[int, Any]]:
    revoke = Revocation("hang", 3, "rank 3 never entered", comm="0:0-31", seq=SEQ)
    stale = job_statuses(32, **{"5": {"op": "broadcast"}})
    stale[17] = dataclasses.replace(stale[17], time_ns=NOW - 90 * NS)
    return {
        "hang at the first rank": job_statuses(32, **{"0": {"seq": 0}}),
        "hang at a middle rank": job_statuses(32, **{"13": {"seq": 0}}),
        "hang at the last rank": job_statuses(32, **{"31": {"seq": 0}}),
        "a mismatch and a stale rank": stale,
        "ranks that are not plain": job_statuses(
            32,
            **{"3": {"seq": 0}, "9": {"revoke": revoke}, "11": {"counters": {"errors": 1}}},
            **{"10": {"stacks": [ThreadStack("MainThread", [])]}},
        ),
        "a healthy job": {r: rank_status(r, 32, seq=0) for r in range(32)},
    }


@pytest.mark.parametrize("name", list(_scenarios()))
def test_a_job_read_through_heads_is_diagnosed_as_one_read_whole(name: str) -> None:
    snaps = _scenarios()[name]
    listing = job_listing(snaps)
    made, store = _through_heads(listing)
    assert made == _every_status(listing)
    assert not store.listed_whole
    plain_kinds = 2  # the ranks in flight, and those between calls (a hang's suspect)
    odd_hosts = {host_of(r) for r in (9, 10, 11)} if "plain" in name else set()
    assert 1 <= len(store.read_whole) <= plain_kinds + len(odd_hosts)
    assert odd_hosts <= set(store.read_whole)  # a rank that could be the answer: read whole


def test_a_broken_status_is_read_whole_and_said_as_every_read_says_it() -> None:
    listing = job_listing(job_statuses(32, **{"20": {"seq": 0}}))
    rewrite_host(listing, "h1", lambda rank, status: "{not json" if rank == 6 else status)
    made, store = _through_heads(listing)
    assert made == _every_status(listing)
    assert "h1" in store.read_whole and not store.listed_whole


def test_a_document_newer_than_its_head_speaks_for_its_host() -> None:
    """Between the listing of the heads and the read of h0's document (a model's), its
    ranks in flight moved on to the next call: that document counts for h0's ranks, and a
    model of the key read from the next host for the others."""
    before = job_listing(job_statuses(32, **{"1": {"seq": 0}}))
    after = dict(before)

    def next_call(rank: int, status: dict[str, Any]) -> dict[str, Any]:
        if status["inflight"]:
            status["inflight"]["seq"] = status["records"][-1]["seq"] = SEQ + 1
        status["time_ns"] += NS
        return status

    rewrite_host(after, "h0", next_call)
    moved = {k: v for k, v in after.items() if "/head/" not in k}
    moved |= {k: v for k, v in before.items() if "/head/" in k}
    made, store = _through_heads(moved)
    assert store.read_whole == ["h0", "h1"]  # h0's ranks moved: h1 gives the model
    fetched = set(store.read_whole)
    expected = {PREFIX + "rdzv/world_size": before[PREFIX + "rdzv/world_size"]}
    for key in (k for k in before if "/host/" in k):
        expected[key] = (moved if _host(key) in fetched else before)[key]
    assert made == _every_status(expected)


def _host(key: str) -> str:
    return key.rsplit("/", 1)[1]


@pytest.mark.parametrize(
    "gap", ["no heads", "a host without a head", "a head that is not one", "too many to read"]
)
def test_what_heads_cannot_answer_cheaply_is_listed_whole(gap: str) -> None:
    n = 4 * (heads.MAX_READS + 1) if gap == "too many to read" else 32
    odd = {str(r): {"counters": {"errors": 1}} for r in range(0, n, 4)}  # one a host
    snaps = job_statuses(n, **{"13": {"seq": 0}}, **(odd if gap == "too many to read" else {}))
    listing = job_listing(snaps)
    if gap == "no heads":  # agents of a cclctl that wrote none
        listing = {k: v for k, v in listing.items() if "/head/" not in k}
    if gap == "a host without a head":
        del listing[PREFIX + "head/h3"]
    if gap == "a head that is not one":  # its ranks unknown: the world is not covered
        listing[PREFIX + "head/h5"] = b"{not json"
    made, store = _through_heads(listing)
    assert store.listed_whole
    assert made == _every_status(listing)
    if gap == "no heads":  # nothing listed twice
        assert store.lists == [PREFIX + "head/", PREFIX]


def test_a_store_that_refuses_a_read_is_listed_whole() -> None:
    """An older store lets a client without the token list statuses, not read one."""

    class Refusing(Store):
        def try_get(self, key: str) -> bytes | None:
            raise StoreError(f"the store at addr refused: get of {key!r}: no token")

    listing = job_listing(job_statuses(32, **{"13": {"seq": 0}}))
    store = Refusing(listing)
    made = _diagnosis(snapshot.fetch(store, JOB, alike_from=0))
    assert store.listed_whole and made == _every_status(listing)


def test_a_small_job_is_listed_whole() -> None:
    store = Store(job_listing(job_statuses(32, **{"13": {"seq": 0}})))
    snapshot.fetch(store, JOB, alike_from=64)
    assert store.lists == [PREFIX + "head/", PREFIX] and not store.reads  # nothing twice


def test_a_head_is_its_document_without_the_statuses() -> None:
    texts = {4: '{"a": 1}', 5: '{"b": 2}'}
    doc = host_status.HostDocument("h1", 7, NOW, 1.0, texts, {6: "gone"}, {"comms": {}},
                                   {5: (55, host_status.PROC_STOPPED)})  # fmt: skip
    head = host_status.parse(doc.head_bytes(), "head")
    assert head.is_head and not head.statuses and sorted(head.ranks) == [4, 5]
    assert (head.summary, head.left, head.procs) == (doc.summary, doc.left, doc.procs)
    whole = host_status.parse(doc.to_bytes(), "doc")
    assert not whole.is_head and sorted(whole.ranks) == [4, 5]
    for ranks in ("[4, 4]", "[-1]", '"4"'):
        value = doc.head_bytes().replace(b"[4,5]", ranks.encode())
        with pytest.raises(host_status.BadInput, match="rank"):
            host_status.parse(value, "head")


@pytest.mark.timeout(120)
def test_a_reader_without_the_token_reads_a_large_job_through_its_heads() -> None:
    """What a stranger may list it may read alone: `diagnose hang --store` without the
    job's token lists the heads and reads the two documents it needs."""
    token, n, planted = "heads-test-token", ALIKE_FROM, 700
    now = time.time_ns()
    with StoreServer(token=token) as server:
        with StoreClient("127.0.0.1", server.port, token=token) as rank:
            rank.set_many(job_listing(job_statuses(n, now, **{str(planted): {"seq": 0}}), now=now))
        env = {k: v for k, v in os.environ.items() if k != "CCLCTL_TOKEN"}
        cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", "--store", server.address,
               "--job", JOB, "--json"]  # fmt: skip
        hang = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=env)
        refused = server.refused
    verdict = json.loads(hang.stdout)["verdicts"][0]
    assert [s["rank"] for s in verdict["suspect_ranks"]] == [planted], hang.stderr
    assert refused == 0  # the heads, the ranks' own keys and two documents: all public
