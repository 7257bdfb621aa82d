"""What a relayed call leaves behind: its record with ``stages`` (and the host calls' own
records), the stage counters the exporter serves, the record's JSON, the ``CCLCTL_STAGE*``
settings and ``relay_efficiency``."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from recording_tracer import RecordingTracer
from thread_ranks import run_ranks

from cclctl.config import RuntimeConfig, runtime_from_env
from cclctl.errors import BadInput, ConfigError, InvalidArgument
from cclctl.records import COMPLETED, CollectiveRecord, record_from_dict
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.relay.copier import HostCopier
from cclctl.runtime.relay.efficiency import relay_efficiency
from cclctl.runtime.relay.pipeline import STAGES
from cclctl.runtime.relay.relay import Relay, is_staged
from cclctl.telemetry.exporter import MetricsExporter
from cclctl.telemetry.hub import Telemetry

CFG = RuntimeConfig(
    job="relay", timeout_s=30.0, connect_timeout_s=10.0, stage="always",
    stage_chunk=4096, stage_depth=3,
)  # fmt: skip


@pytest.mark.timeout(60)
def test_a_relayed_call_is_one_record_with_its_stages():
    def rank(comm: Communicator) -> list[CollectiveRecord]:
        comm.tracer = tracer = RecordingTracer()
        Relay(comm, HostCopier(), CFG).all_reduce(np.ones(5000, np.float32))
        return tracer.finished

    for records in run_ranks(2, rank, CFG):
        relayed = [r for r in records if r.comm == "0:0-1/relay"]
        host = [r for r in records if r.comm == "0:0-1"]
        assert len(relayed) == 1 and len(host) == 5  # 20000 bytes in 4096-byte chunks
        (rec,) = relayed
        assert (rec.op, rec.algo, rec.seq, rec.state) == ("all_reduce", "relay", 1, COMPLETED)
        assert (rec.count, rec.nbytes, rec.dtype) == (5000, 20000, "float32")
        assert set(rec.stages) == set(STAGES) and rec.stages["collective"] > 0
        assert all(h.stages == {} for h in host)


@pytest.mark.timeout(60)
def test_a_relayed_call_reaches_telemetry_ended_never_in_flight():
    """What is in flight during a relay is the chunk's own call (the watchdog's business),
    so a long relay of healthy chunks is never taken for a hang."""

    def rank(comm: Communicator) -> list[tuple[str, bool]]:
        seen: list[tuple[str, bool]] = []
        comm.tracer = RecordingTracer(on_start=lambda r: seen.append((r.comm, r.end_ns > 0)))
        Relay(comm, HostCopier(), CFG).broadcast(np.ones(3000, np.float32), 0)
        return seen

    for seen in run_ranks(2, rank, CFG):
        assert seen[-1] == ("0:0-1/relay", True)
        assert {ended for comm, ended in seen[:-1]} == {False} and len(seen) == 4


@pytest.mark.timeout(60)
def test_stage_seconds_reach_the_exporter():
    made: list[Telemetry] = []

    def rank(comm: Communicator) -> bytes:
        tel = Telemetry(CFG, rank=comm.rank, world_size=comm.world_size)
        made.append(tel)
        comm.tracer = tel
        relay = Relay(comm, HostCopier(), CFG)
        relay.all_gather(np.ones(3000, np.float64), np.empty(6000, np.float64))
        return MetricsExporter(tel.metrics_view).render()

    try:
        texts = run_ranks(2, rank, CFG)
    finally:
        for tel in made:
            tel.close()
            tel.remove_hooks()
    samples = {
        (s.labels["comm"], s.labels["op"], s.labels["stage"]): s.value
        for fam in text_string_to_metric_families(texts[0].decode())
        if fam.name == "cclctl_relay_stage_seconds"
        for s in fam.samples
        if s.name.endswith("_total")
    }
    assert set(samples) == {("0:0-1/relay", "all_gather", stage) for stage in STAGES}
    assert samples["0:0-1/relay", "all_gather", "collective"] > 0


def test_stages_are_written_only_when_there_are_some_and_read_back():
    plain = CollectiveRecord("0:0-1", 1, "all_reduce")
    assert "stages" not in plain.to_dict()
    relayed = CollectiveRecord("0:0-1/relay", 1, "all_reduce", stages={"d2h": 5, "h2d": 7})
    doc = relayed.to_dict()
    assert doc["stages"] == {"d2h": 5, "h2d": 7}
    assert record_from_dict(doc).stages == {"d2h": 5, "h2d": 7}
    assert record_from_dict(plain.to_dict()).stages == {}
    for bad in ([1], {"d2h": -1}, {"d2h": "5"}, {"d2h": True}, {str(i): 1 for i in range(17)}):
        with pytest.raises(BadInput, match="stage"):
            record_from_dict({**doc, "stages": bad})


def test_the_stage_settings_come_from_the_environment():
    cfg = runtime_from_env(
        {"CCLCTL_STAGE": "always", "CCLCTL_STAGE_CHUNK": "64K", "CCLCTL_STAGE_DEPTH": "3"}
    )
    assert (cfg.stage, cfg.stage_chunk, cfg.stage_depth) == ("always", 64 << 10, 3)
    default = runtime_from_env({})
    assert (default.stage, default.stage_chunk, default.stage_depth) == ("auto", 4 << 20, 4)
    for name, value in (
        ("CCLCTL_STAGE", "sometimes"),
        ("CCLCTL_STAGE_CHUNK", "1K"),
        ("CCLCTL_STAGE_CHUNK", "lots"),
        ("CCLCTL_STAGE_DEPTH", "1"),
    ):
        with pytest.raises(ConfigError, match=name):
            runtime_from_env({name: value})


def test_which_buffers_are_staged():
    auto, always, never = (CFG.replace(stage=s) for s in ("auto", "always", "never"))
    assert (is_staged(auto, True), is_staged(auto, False)) == (False, True)
    assert (is_staged(always, True), is_staged(always, False)) == (True, True)
    assert is_staged(never, True) is False
    with pytest.raises(InvalidArgument, match="CCLCTL_STAGE=never"):
        is_staged(never, False)


def test_relay_efficiency_is_the_slowest_stage_over_the_call():
    stages = {"d2h": 400, "collective": 1000, "h2d": 500}
    assert relay_efficiency("all_reduce", 1 << 20, 4, 1000, stages) == pytest.approx(1.0)
    assert relay_efficiency("all_reduce", 1 << 20, 4, 1900, stages) == pytest.approx(1000 / 1900)
    assert relay_efficiency("all_gather", 1 << 20, 2, 2000, {**stages, "h2d": 0}) == 0.5
    assert relay_efficiency("all_reduce", 1 << 20, 2, 0, stages) == 0.0
    assert relay_efficiency("all_reduce", 1 << 20, 2, 1000, {}) == 0.0
