"""``slow`` in CCLCTL_FAULT: a rank persistently late into every collective from a seq on,
by a fixed delay or a fraction of its step; parsed and refused like every plan."""

from __future__ import annotations

import numpy as np
import pytest
from thread_ranks import run_ranks

from cclctl.config import RuntimeConfig
from cclctl.config_check import preflight
from cclctl.errors import ConfigError
from cclctl.runtime.comm import faults


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_slow_plans_parse_beside_the_other_faults() -> None:
    plan = faults.parse(
        "slow:rank=3:seq=10:delay=0.02; kill:rank=1:seq=4; slow:rank=3:seq=2:factor=0.3:comm=1:0-1"
    )
    assert plan.faults == (faults.Fault("kill", 1, 4),)
    assert plan.slow == (
        faults.Fault("slow", 3, 10, "", "0.02", "delay"),
        faults.Fault("slow", 3, 2, "1:0-1", "0.3", "factor"),
    )
    assert plan.at(3, 10, "0:0-3") is None  # a slowdown never hides a one-seq fault
    assert plan.slowdown(1) is None
    assert plan.slowdown(3) is not None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("slow:rank=3:seq=10", "slow needs one of delay= (seconds) or factor="),
        ("slow:rank=3:seq=10:delay=1:factor=2", "slow needs one of delay="),
        ("slow:rank=3:seq=10:delay=-1", "delay='-1' must be a number from 0 to 60"),
        ("slow:rank=3:seq=10:delay=fast", "delay='fast' must be a number"),
        ("slow:rank=3:seq=10:factor=nan", "factor='nan' must be a number from 0 to 100"),
        ("slow:rank=3:seq=10:factor=1000", "factor='1000' must be a number from 0 to 100"),
        ("slow:rank=3:seq=10:factor=0.3:color=red", "unexpected color"),
        ("slow:rank=3:delay=1", "missing seq="),
    ],
)
def test_bad_slow_plans_are_named(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match="CCLCTL_FAULT item") as info:
        faults.parse(spec)
    assert message in str(info.value)


def test_the_preflight_refuses_a_bad_slow_plan_before_anything_starts() -> None:
    env = {"CCLCTL_FAULT": "slow:rank=1:seq=1:factor=-3"}
    with pytest.raises(ConfigError, match="factor='-3'"):
        preflight("launch", env=env, parsers={"CCLCTL_FAULT": faults.parse})


def test_a_delay_strikes_every_collective_from_its_seq_on() -> None:
    slow = faults.parse("slow:rank=0:seq=3:delay=0.02").slowdown(0)
    assert slow is not None
    assert [slow.delay_s(seq, "0:0-1") for seq in range(1, 6)] == [0, 0, 0.02, 0.02, 0.02]


def test_a_factor_is_a_fraction_of_the_time_since_the_previous_call_ended() -> None:
    clock = Clock()
    slow = faults.Slowdown(faults.parse("slow:rank=0:seq=1:factor=0.5:comm=0:0-1").slow, clock)
    assert slow.delay_s(1, "0:0-1") == 0  # no call ended yet: no step to stretch
    slow.ended()
    clock.now += 0.4  # the rank computed for 0.4 s
    assert slow.delay_s(2, "0:0-1") == pytest.approx(0.2)
    assert slow.delay_s(2, "1:0-2") == 0  # another communicator


def test_a_slow_rank_sleeps_before_each_collective_it_enters(monkeypatch) -> None:
    slept: list[tuple[int, float]] = []

    class Recording(faults.Slowdown):
        def before(self, seq: int, comm: str) -> None:
            slept.append((seq, self.delay_s(seq, comm)))

    monkeypatch.setattr(faults, "Slowdown", Recording)
    cfg = RuntimeConfig(fault="slow:rank=1:seq=2:delay=0.001", timeout_s=30)

    def body(comm):
        buf = np.ones(4, np.float32)
        for _ in range(4):
            comm.all_reduce(buf)
        return buf[0]

    assert run_ranks(2, body, cfg) == [16.0, 16.0]
    assert slept == [(1, 0), (2, 0.001), (3, 0.001), (4, 0.001)]  # rank 1's calls only
