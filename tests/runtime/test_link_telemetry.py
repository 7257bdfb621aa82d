"""A communicator's link counts reach telemetry under the job's ranks: the world's as they
are, a shrunk communicator's (which numbers its members 0..n-1) mapped through its members,
and the handshakes every transport's links refused, renewed or shrunk links included; a
transport that counts no bytes (no :class:`LinkCounters`) has no link series."""

from __future__ import annotations

from typing import Any, cast

from telemetry_helpers import config

from cclctl.runtime.job import link_telemetry
from cclctl.telemetry.hub import Telemetry


class _Links:
    def __init__(self, resumed: list[int], auth_failures: int) -> None:
        self.resumed = resumed
        self.auth_failures = auth_failures


class _Transport:
    def __init__(self, sent: list[int], received: list[int]) -> None:
        self.sent, self.received = sent, received

    def link_bytes(self) -> tuple[list[int], list[int]]:
        return list(self.sent), list(self.received)


def _watch(tel: Telemetry, transport: _Transport, links: _Links, *how: Any) -> None:
    link_telemetry.watch(tel, cast(Any, transport), cast(Any, links), *how)


def test_the_world_and_a_shrunk_communicator_count_under_the_jobs_ranks() -> None:
    tel = Telemetry(config(), rank=0, world_size=4)
    try:
        world = _Links(resumed=[0, 2, 0, 0], auth_failures=1)
        _watch(tel, _Transport([0, 10, 20, 30], [0, 11, 21, 31]), world)
        # rank 1 was shrunk away: the survivors 0, 2, 3 are the new communicator's 0, 1, 2
        shrunk = _Links(resumed=[0, 0, 5], auth_failures=2)
        _watch(tel, _Transport([0, 100, 200], [0, 101, 201]), shrunk, [0, 2, 3])
        view = tel.metrics_view()
    finally:
        tel.close()
    assert view.links == {1: (10, 11), 2: (120, 122), 3: (230, 232)}
    assert view.link_resumes == {1: 2, 3: 5}
    assert view.link_auth_failures == 3


def test_counts_are_read_when_a_view_is_built() -> None:
    tel = Telemetry(config(), rank=0, world_size=2)
    try:
        links, transport = _Links([0, 0], 0), _Transport([0, 0], [0, 0])
        _watch(tel, transport, links)
        links.resumed[1], links.auth_failures, transport.sent[1] = 1, 4, 64
        view = tel.metrics_view()
    finally:
        tel.close()
    assert (view.link_resumes, view.link_auth_failures, view.links) == ({1: 1}, 4, {1: (64, 0)})


def test_a_transport_without_link_counters_has_no_link_series() -> None:
    class ExchangeOnly:
        name = "bare"

    tel = Telemetry(config(), rank=0, world_size=2)
    try:
        _watch(tel, cast(Any, ExchangeOnly()), _Links([0, 3], 2))
        view = tel.metrics_view()
    finally:
        tel.close()
    assert (view.links, view.link_resumes, view.link_auth_failures) == ({}, {1: 3}, 2)
