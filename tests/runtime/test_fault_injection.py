"""Fault injection is a seam, not part of the transport interface: a communicator's calls
hold an injector only when ``CCLCTL_FAULT`` names a fault of this rank, a ``link`` fault
cuts a link through the transport's :class:`LinkCutter`, and a transport with nothing but
the exchange runs a communicator whole (calls, failure, close)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from shm_thread_ranks import make_transports

from cclctl.config import RuntimeConfig
from cclctl.errors import ConfigError
from cclctl.runtime.algorithms.context import Scratch
from cclctl.runtime.comm.calls import Calls
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.transport.base import LinkCounters, LinkCutter, PeerAnnouncer, Transfer, Wait
from cclctl.runtime.transport.capabilities import POINT_TO_POINT
from cclctl.runtime.transport.wire import Call

pytestmark = pytest.mark.timeout(60)


class ExchangeOnly:
    """A transport with the exchange and the close, and no hook beside them."""

    name = "bare"
    capabilities = POINT_TO_POINT

    def __init__(self) -> None:
        self.closed = False

    def exchange(
        self, call: Call, step: int, sends: Sequence[Transfer], recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:  # fmt: skip
        assert not sends and not recvs  # one rank moves no bytes

    def close(self) -> None:
        self.closed = True


class Cuttable(ExchangeOnly):
    """... and a link fault's hold on it."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[int] = []

    def drop_link(self, peer: int) -> None:
        self.dropped.append(peer)


def _comm(transport: ExchangeOnly, fault: str = "") -> Communicator:
    cfg = RuntimeConfig(job="seam", fault=fault)
    return Communicator(rank=0, world_size=1, transport=transport, cfg=cfg, comm_id="0:0")


@pytest.mark.parametrize(
    ("spec", "installed"),
    [
        ("", False),
        ("kill:rank=1:seq=2", False),  # another rank's
        ("slow:rank=3:seq=1:delay=1", False),
        ("op:rank=0:seq=1:to=broadcast:comm=7:0-1", False),  # another communicator's
        ("op:rank=0:seq=9:to=broadcast:comm=0:0", True),
        ("slow:rank=0:seq=4:delay=0", True),
    ],
)
def test_calls_hold_an_injector_only_for_a_fault_that_can_strike_them(
    spec: str, installed: bool
) -> None:
    cfg = RuntimeConfig(job="seam", fault=spec)
    calls = Calls(
        rank=0, world_size=1, comm_id="0:0", transport=ExchangeOnly(), cfg=cfg,
        scratch=Scratch(), watchdog=False,
    )  # fmt: skip
    assert (calls.injector is not None) is installed


def test_a_transport_with_only_the_exchange_runs_a_communicator() -> None:
    transport = ExchangeOnly()
    assert not isinstance(transport, LinkCutter | LinkCounters | PeerAnnouncer)
    comm = _comm(transport)
    out = comm.all_reduce(np.ones(2, np.float32))
    comm.barrier()
    comm.close()  # the failure state has no announce to call
    assert out.tolist() == [1.0, 1.0] and transport.closed
    assert comm.failure.status == "closed"


def test_a_link_fault_cuts_through_the_transports_link_cutter_once() -> None:
    transport = Cuttable()
    comm = _comm(transport, "link:rank=0:seq=2:peer=0")
    try:
        comm.barrier()
        assert transport.dropped == []
        comm.barrier()
        comm.barrier()
        assert transport.dropped == [0]
    finally:
        comm.close()


def test_a_link_fault_on_a_transport_that_cannot_cut_one_is_named() -> None:
    comm = _comm(ExchangeOnly(), "link:rank=0:seq=1:peer=0")
    try:
        with pytest.raises(ConfigError, match="the bare transport cannot cut a link"):
            comm.barrier()
    finally:
        comm.close()


def test_every_concrete_transport_offers_every_hook() -> None:
    transports = make_transports(3, ["a", "a", "b"]) + make_transports(2, ["a", "a"])
    transports += make_transports(2, ["a", "b"])
    try:
        assert {type(t).__name__ for t in transports} == {
            "HybridTransport", "ShmTransport", "TcpTransport"
        }  # fmt: skip
        for t in transports:
            assert isinstance(t, LinkCutter) and isinstance(t, LinkCounters), t
            assert isinstance(t, PeerAnnouncer), t
    finally:
        for t in transports:
            t.close()
