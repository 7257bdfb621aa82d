"""The fan-in world document: small, strict, and carrying the transport's facts."""

from __future__ import annotations

import json

import pytest

from cclctl.errors import RendezvousError
from cclctl.runtime.hostagent import world_doc

CLAIMS = [(0, "a", 100), (1, "a", 101), (2, "b", 200), (3, "b", 201)]


def test_one_key_per_host_adds_nothing_to_the_document() -> None:
    plain = world_doc.build(4, CLAIMS)
    keyed = world_doc.build(4, CLAIMS, {0: "k1", 1: "k1", 2: "k2", 3: "k2"})
    assert keyed == plain
    assert json.loads(plain) == {
        "world_size": 4,
        "hosts": [
            {"host": "a", "ranks": "0-1", "pids": "100+2"},
            {"host": "b", "ranks": "2-3", "pids": "200+2"},
        ],
    }
    world = world_doc.read(plain, 4)
    assert world.keys == ["a", "a", "b", "b"] and world.tcp == []
    assert world_doc.expand(plain, 4) == (["a", "a", "b", "b"], [100, 101, 200, 201])


def test_a_host_name_with_two_keys_is_split_and_its_ranks_told_apart() -> None:
    raw = world_doc.build(4, CLAIMS, {0: "k1", 1: "k9", 2: "k2", 3: "k2"}, tcp=[3, 1])
    doc = json.loads(raw)
    assert doc["hosts"][:2] == [
        {"host": "a", "key": "k1", "ranks": "0", "pids": "100"},
        {"host": "a", "key": "k9", "ranks": "1", "pids": "101"},
    ]
    assert doc["tcp"] == "1,3"
    world = world_doc.read(raw, 4)
    assert world.hosts == ["a", "a", "b", "b"]
    assert len({world.keys[0], world.keys[1], world.keys[2]}) == 3
    assert world.keys[2] == world.keys[3] == "b"
    assert world.tcp == [1, 3]
    # the agent of host "a" finds both of its entries
    assert world_doc.host_members(raw, "a", 4) == {0: 100, 1: 101}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"world_size": 2, "hosts": [{"host": "a", "ranks": "0-1", "pids": "1+2"}], "tcp": "5"},
         "unreadable"),
        ({"world_size": 2, "hosts": [{"host": "a", "key": 7, "ranks": "0-1", "pids": "1+2"}]},
         "key that is no string"),
        ({"world_size": 2, "hosts": [{"host": "a", "key": "x", "ranks": "0", "pids": "1"},
                                     {"host": "a", "key": "y", "ranks": "0", "pids": "2"}]},
         "rank 0 is on two hosts"),
        ({"world_size": 2, "hosts": [{"host": "a", "key": "x", "ranks": "0", "pids": "1"}]},
         "lacks ranks 1"),
    ],
)  # fmt: skip
def test_a_bad_document_is_a_rendezvous_error(doc: dict[str, object], says: str) -> None:
    with pytest.raises(RendezvousError, match=says):
        world_doc.read(json.dumps(doc).encode(), 2)


def test_an_unreadable_split_entry_is_a_rendezvous_error_for_the_agent() -> None:
    raw = b'{"world_size":2,"hosts":[{"host":"a","key":"x","ranks":"0","pids":"1"},' + (
        b'{"host":"a","key":"y","ranks":"9","pids":"2"}]}'
    )
    with pytest.raises(RendezvousError, match="unreadable"):
        world_doc.host_members(raw, "a", 2)
