"""The Prometheus exporter, served on a real port and scraped over HTTP."""

from __future__ import annotations

import os
import select
import signal
import socket
import time
import urllib.request

import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from telemetry_helpers import T0, config, run

from cclctl import __version__
from cclctl.bandwidth import COLLECTIVES
from cclctl.errors import ConfigError
from cclctl.records import FAILED, CollectiveRecord
from cclctl.telemetry.counters import ERROR_REASONS
from cclctl.telemetry.exporter import MetricsExporter
from cclctl.telemetry.exporter_families import JOB_LABEL
from cclctl.telemetry.hub import Telemetry

ALLOWED_LABELS = {JOB_LABEL, "rank", "comm", "op", "peer", "reason", "le", "direction", "phase"}
#: Labels Prometheus itself puts on every series of a target; with the default
#: ``honor_labels: false`` a series' own label of that name becomes ``exported_<name>``.
TARGET_LABELS = {"job", "instance"}


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of one scrape, keyed by name and label set."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset({JOB_LABEL: "job1", "rank": "1", **labels}.items())


@pytest.mark.timeout(20)
def test_scrape_reports_exact_counters(make_tel):
    tel = make_tel(rank=1, world_size=4)
    tel.register_comm("w", [0, 1, 2, 3])
    run(tel, "w", 1, nbytes=1000, duration_ns=30_000)  # le 5e-05
    run(tel, "w", 2, nbytes=3000, duration_ns=3_000_000)  # le 0.005
    run(tel, "sub", 1, nbytes=500, duration_ns=30_000, world_size=2)
    run(tel, "w", 3, state=FAILED)
    tel.count_retry("w", "all_reduce")
    tel.count_hang("w", "all_reduce")
    tel.link_bytes(2, 4096, 1024)
    tel.start(CollectiveRecord("w", 4, "all_reduce", start_ns=T0 + 10**10))
    tel.snapshot("status")  # the heartbeat
    url = tel.serve_metrics(0)
    assert url is not None and url.startswith("http://127.0.0.1:") and url.endswith("/metrics")

    m = scrape(url)
    w_ar = {"comm": "w", "op": "all_reduce"}
    assert m[key("cclctl_collectives_total", **w_ar)] == 2
    assert m[key("cclctl_collective_bytes_total", **w_ar)] == 4000
    assert m[key("cclctl_collective_bus_bytes_total", **w_ar)] == pytest.approx(6000)
    assert m[key("cclctl_collective_bus_bytes_total", comm="sub", op="all_reduce")] == 500
    assert m[key("cclctl_collective_seconds_total", **w_ar)] == pytest.approx(0.00303)
    assert m[key("cclctl_collective_errors_total", reason="failed", **w_ar)] == 1
    assert m[key("cclctl_collective_retries_total", **w_ar)] == 1
    assert m[key("cclctl_collective_hangs_total", **w_ar)] == 1
    assert m[key("cclctl_link_sent_bytes_total", peer="2")] == 4096
    assert m[key("cclctl_link_received_bytes_total", peer="2")] == 1024
    assert m[key("cclctl_collective_last_started_seq", comm="w")] == 4
    assert m[key("cclctl_collective_last_completed_seq", comm="w")] == 2
    assert m[key("cclctl_collective_inflight_start_timestamp_seconds", comm="w")] == pytest.approx(
        (T0 + 10**10) / 1e9
    )
    assert m[key("cclctl_collective_inflight_start_timestamp_seconds", comm="sub")] == 0
    heartbeat = m[key("cclctl_status_heartbeat_timestamp_seconds")]
    assert heartbeat == pytest.approx(tel.heartbeat_ns / 1e9)
    info = key("cclctl_info", version=__version__, host="node-a", backend="cclctl")
    assert m[info] == 1

    hist = "cclctl_collective_duration_seconds"
    assert m[key(f"{hist}_bucket", op="all_reduce", le="2e-05")] == 0
    assert m[key(f"{hist}_bucket", op="all_reduce", le="5e-05")] == 2  # w and sub summed
    assert m[key(f"{hist}_bucket", op="all_reduce", le="0.002")] == 2
    assert m[key(f"{hist}_bucket", op="all_reduce", le="0.005")] == 3
    assert m[key(f"{hist}_bucket", op="all_reduce", le="+Inf")] == 3
    assert m[key(f"{hist}_count", op="all_reduce")] == 3
    assert m[key(f"{hist}_sum", op="all_reduce")] == pytest.approx(0.00306)


@pytest.mark.timeout(20)
def test_counters_are_read_at_scrape_time(make_tel):
    tel = make_tel(rank=1)
    url = tel.serve_metrics(0)
    assert url is not None
    assert key("cclctl_collectives_total", comm="w", op="all_reduce") not in scrape(url)
    run(tel, "w", 1)
    assert scrape(url)[key("cclctl_collectives_total", comm="w", op="all_reduce")] == 1


@pytest.mark.timeout(20)
def test_link_resumes_are_summed_over_the_links_of_every_epoch_at_scrape_time(make_tel):
    """Each epoch's links count their own resumes; a scrape and a status add them up."""
    tel = make_tel(rank=1)
    first, renewed = [0, 0, 2], [1, 0, 0]
    tel.add_resume_source(lambda: first)
    tel.add_resume_source(lambda: renewed)
    url = tel.serve_metrics(0)
    assert url is not None
    renewed[2] = 3  # read when scraped, not when added
    got = scrape(url)
    assert got[key("cclctl_link_resumes_total", peer="2")] == 5
    assert got[key("cclctl_link_resumes_total", peer="0")] == 1
    assert key("cclctl_link_resumes_total", peer="1") not in got
    assert tel.snapshot().counters["link_resumes"] == 6


@pytest.mark.timeout(20)
def test_names_and_labels_follow_the_conventions(make_tel):
    tel = make_tel(rank=1)
    run(tel, "w", 1, state=FAILED)
    run(tel, "w", 2)
    tel.link_bytes(0, 1, 1)
    tel.peer_waits.add(0, 3, 5)  # blocked receiving from rank 0 before it arrived
    url = tel.serve_metrics(0)
    assert url is not None
    with urllib.request.urlopen(url, timeout=5) as resp:
        families = list(text_string_to_metric_families(resp.read().decode()))
    assert {fam.name for fam in families} == {
        "cclctl_collectives",
        "cclctl_collective_bytes",
        "cclctl_collective_bus_bytes",
        "cclctl_collective_seconds",
        "cclctl_collective_errors",
        "cclctl_collective_hangs",
        "cclctl_collective_retries",
        "cclctl_collective_duration_seconds",
        "cclctl_collective_last_started_seq",
        "cclctl_collective_last_completed_seq",
        "cclctl_collective_inflight_start_timestamp_seconds",
        "cclctl_link_sent_bytes",
        "cclctl_link_received_bytes",
        "cclctl_link_resumes",
        "cclctl_peer_wait_seconds",
        "cclctl_status_heartbeat_timestamp_seconds",
        "cclctl_status_publish_errors",
        "cclctl_link_auth_failures",
        "cclctl_info",
    }
    for fam in families:
        assert fam.name.startswith("cclctl_")
        for sample in fam.samples:
            if fam.type == "counter":
                assert sample.name.endswith(("_total", "_created"))
            assert not set(sample.labels) & TARGET_LABELS, sample
            assert not any(label.startswith("__") for label in sample.labels), sample
            if fam.name != "cclctl_info":  # it also carries version, host and backend
                assert set(sample.labels) <= ALLOWED_LABELS, sample


@pytest.mark.timeout(20)
def test_fault_counters_have_zero_series_from_the_first_scrape(make_tel):
    """Before any call, every op and error reason of a declared communicator has a zero
    series, so ``increase()`` counts the first error or hang (a series born at 1 shows none).
    """
    tel = make_tel(rank=1)
    tel.register_comm("w", [0, 1, 2, 3])
    url = tel.serve_metrics(0)
    assert url is not None
    m = scrape(url)
    for op in COLLECTIVES:
        assert m[key("cclctl_collective_hangs_total", comm="w", op=op)] == 0
        assert m[key("cclctl_collective_retries_total", comm="w", op=op)] == 0
        for reason in ERROR_REASONS:
            assert m[key("cclctl_collective_errors_total", comm="w", op=op, reason=reason)] == 0
    assert m[key("cclctl_collective_last_started_seq", comm="w")] == 0
    assert key("cclctl_collectives_total", comm="w", op="all_reduce") not in m
    tel.count_error("w", "all_reduce", "connect")  # a reason not known up front joins them
    run(tel, "w", 1, state=FAILED)
    m = scrape(url)
    err = "cclctl_collective_errors_total"
    assert m[key(err, comm="w", op="all_reduce", reason="connect")] == 1
    assert m[key(err, comm="w", op="all_reduce", reason=FAILED)] == 1
    assert m[key(err, comm="w", op="all_reduce", reason="aborted")] == 0
    assert m[key(err, comm="w", op="broadcast", reason=FAILED)] == 0


@pytest.mark.timeout(20)
def test_port_is_the_base_port_plus_local_rank_and_is_freed_on_close():
    port = free_port()
    tel = Telemetry(config(metrics_port=port - 2), rank=5, world_size=8, local_rank=2)
    try:
        assert tel.serve_metrics() == f"http://127.0.0.1:{port}/metrics"
        assert scrape(tel.metrics_url)
    finally:
        tel.close()
        tel.close()
    assert tel.metrics_url == ""
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_no_port_configured_means_no_exporter(make_tel):
    tel = make_tel()
    assert tel.serve_metrics() is None and tel.metrics_url == ""


@pytest.mark.timeout(20)
def test_busy_port_is_a_config_error(make_tel):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        tel = make_tel(metrics_port=port)
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            tel.serve_metrics()


def _read_within(fd: int, seconds: float, size: int) -> bytes:
    """Up to ``size`` bytes from ``fd``: no more, so two messages are never read as one."""
    ready, _, _ = select.select([fd], [], [], seconds)
    return os.read(fd, size) if ready else b""


@pytest.mark.timeout(30)
def test_a_forked_child_neither_serves_nor_holds_the_port(make_tel):
    """A fork (a DataLoader worker) keeps no copy of the listening socket, so the port is
    free once the rank stops serving, while the child still runs; stopping in the child
    returns at once (a real stop would wait for a serving thread the child does not have).
    """
    tel = make_tel(metrics_port=free_port())
    url = tel.serve_metrics()
    assert url is not None
    port = int(url.split(":")[2].split("/")[0])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, stop, report, then linger as a worker would
        try:
            os.write(write_end, b"up")
            tel.close()
            os.write(write_end, b"stopped")
            time.sleep(20)
        finally:
            os._exit(0)
    try:
        os.close(write_end)
        assert _read_within(read_end, 10, 2) == b"up"
        assert scrape(url)  # the rank still serves
        tel.close()
        with socket.socket() as again:  # the port is free again while the child lives
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", port))
            again.listen()
        assert _read_within(read_end, 10, 7) == b"stopped"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)


def test_peer_waits_are_served_per_peer_direction_and_phase_only_where_waited(make_tel):
    tel = make_tel(rank=1)
    tel.peer_waits.add(0, 0, 2_000_000_000)  # sending to rank 0, data phase
    tel.peer_waits.add(3, 3, 500_000_000)  # receiving from rank 3 before it arrived
    families = text_string_to_metric_families(MetricsExporter(tel.metrics_view).render().decode())
    waits = next(f for f in families if f.name == "cclctl_peer_wait_seconds")
    got = {
        (s.labels["peer"], s.labels["direction"], s.labels["phase"]): s.value
        for s in waits.samples
        if s.name.endswith("_total")
    }
    assert got == {("0", "send", "data"): 2.0, ("3", "recv", "entry"): 0.5}
