"""`cclctl bench --stage always`: the sweep's calls through the relay, its stages as columns
of the table, JSON and CSV; ``--stage`` checked like every flag; without staging, nothing
changes."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from test_bench_cli import _run
from thread_ranks import run_ranks

from cclctl.benchmark import events, report, stage_columns
from cclctl.benchmark.catalog import OPS
from cclctl.benchmark.options import BenchOptions, build_options
from cclctl.benchmark.results import RelayTiming, Row, RunMeta, Timing
from cclctl.benchmark.sweep import Sweep, gather_meta, total_rows
from cclctl.config import RuntimeConfig
from cclctl.errors import ConfigError
from cclctl.runtime.comm.communicator import Communicator

RELAYED = [op for op in OPS if op != "sendrecv"]


def _opts(**changes: Any) -> BenchOptions:
    base: dict[str, Any] = {
        "minbytes": 8,
        "maxbytes": 64 << 10,
        "stepfactor": 16,
        "iters": 2,
        "warmup_iters": 1,
        "stage": "always",
    }
    return BenchOptions(**(base | changes))


def _sane(relay: RelayTiming | None) -> None:
    assert relay is not None
    assert relay.d2h_us >= 0 and relay.h2d_us >= 0 and relay.collective_us > 0
    assert 0 < relay.efficiency <= 1.5, relay  # a ratio of the slowest stage to the call


@pytest.mark.timeout(90)
def test_staged_sweep_relays_every_collective_and_checks_clean() -> None:
    """Chunks of 4 KiB: the larger sizes run as several pipelined chunks per call."""
    opts = _opts(ops=OPS, root=1)

    def body(comm: Communicator) -> tuple[RunMeta, list[Row]]:
        return gather_meta(comm, opts), list(Sweep(comm, opts).rows())

    cfg = RuntimeConfig(stage_chunk=4096, stage_depth=3)
    per_rank = run_ranks(3, body, cfg=cfg, timeout_s=80)
    meta, rows = per_rank[0]
    assert per_rank[1][1] == rows and per_rank[2][1] == rows  # stages combined like times
    assert len(rows) == total_rows(opts, 3)
    for row in rows:
        assert row.out_of_place.wrong == 0, row
        assert row.in_place.wrong == (None if row.op == "sendrecv" else 0), row
        if row.op == "sendrecv":  # point-to-point: not relayed, no stages
            assert row.out_of_place.relay is None and row.in_place.relay is None
        else:
            _sane(row.out_of_place.relay)
            _sane(row.in_place.relay)
    assert stage_columns.is_staged(meta)


@pytest.mark.timeout(60)
def test_without_staging_rows_carry_no_stages() -> None:
    for stage in ("auto", "never"):
        opts = _opts(ops=("all_reduce", "all_gather"), stage=stage, maxbytes=1 << 10)
        rows = run_ranks(2, lambda comm, o=opts: list(Sweep(comm, o).rows()))[0]
        assert rows and all(t.relay is None for r in rows for t in r.timings)
        assert all("stages" not in t.to_dict() for r in rows for t in r.timings)


def _staged_meta(stage: str = "always", backend: str = "cclctl") -> RunMeta:
    opts = _opts(ops=("all_reduce", "sendrecv"), stage=stage, backend=backend)
    return RunMeta(2, (), backend, "0.1.0", opts.to_dict(), "start", "end")


def _rows() -> list[Row]:
    relay = RelayTiming(12.5, 300.25, 7.0, 0.875)
    timing = Timing(320.0, 0.5, 0.5, 0, relay)
    plain = Timing(100.0, 0.1, 0.1, 0)
    return [
        Row("all_reduce", 1024, 256, "float", "sum", -1, timing, timing),
        Row("sendrecv", 1024, 256, "float", "none", -1, plain, Timing(90.0, 0.1, 0.1, None)),
    ]


def test_staged_table_has_the_relay_columns_and_na_where_not_relayed() -> None:
    text = report.render_table(_staged_meta(), _rows())
    assert "backend: cclctl stage: always" in text
    lines = text.splitlines()
    names = next(line for line in lines if line.startswith("#       size"))
    assert names.split()[-8:] == ["d2h", "coll", "h2d", "eff"] * 2
    assert "relay out-of-place" in text and "relay in-place" in text
    reduced = next(line for line in lines if line.lstrip().startswith("1024") and "sum" in line)
    assert reduced.split()[-8:] == ["12.50", "300.2", "7.00", "0.88"] * 2
    sent = next(line for line in lines if "none" in line and not line.startswith("#"))
    assert sent.split()[-8:] == ["N/A"] * 8


def _plain(timing: Timing) -> Timing:
    return dataclasses.replace(timing, relay=None)


def test_unstaged_and_torch_tables_have_no_relay_columns() -> None:
    rows = [dataclasses.replace(r, out_of_place=_plain(r.out_of_place), in_place=_plain(r.in_place))
            for r in _rows()]  # fmt: skip
    for meta in (_staged_meta("auto"), _staged_meta("always", "torch-cclctl")):
        text = report.render_table(meta, rows)
        assert "d2h" not in text and "relay" not in text
    assert "stage:" not in report.render_table(_staged_meta("auto"), rows)


def test_staged_json_and_csv_carry_the_stages_and_round_trip() -> None:
    meta, rows = _staged_meta(), _rows()
    doc = json.loads(json.dumps(report.to_document(meta, rows)))
    assert doc["meta"]["stage"] == "always"
    placement = doc["rows"][0]["out_of_place"]
    assert placement["stages"] == {"d2h": 12.5, "collective": 300.25, "h2d": 7.0}
    assert placement["relay_efficiency"] == 0.875
    assert "stages" not in doc["rows"][1]["in_place"]
    assert [Row.from_dict(row) for row in doc["rows"]] == rows
    collector = events.Collector()  # rank 0's stream keeps them too
    assert [collector.feed(events.row_line(row)) for row in rows] == rows

    table = list(csv.DictReader(io.StringIO(report.render_csv(rows, staged=True))))
    assert list(table[0]) == [*report.CSV_COLUMNS, *stage_columns.CSV_COLUMNS]
    assert float(table[0]["in_place_collective_us"]) == 300.25
    assert float(table[0]["out_of_place_relay_efficiency"]) == 0.875
    assert table[1]["out_of_place_d2h_us"] == ""
    assert report.render_csv(rows).splitlines()[0] == ",".join(report.CSV_COLUMNS)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"stage": "sometimes"}, "--stage 'sometimes' is not one of auto, always, never"),
        ({"stage": "always", "backend": "gloo"}, "--stage applies to --backend cclctl"),
    ],
)
def test_bad_stage_names_the_flag(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_options(**kwargs)
    assert words in str(info.value)


def test_stage_comes_from_the_flag_else_cclctl_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCLCTL_STAGE", "always")
    assert build_options().staged and build_options(stage="never").stage == "never"
    assert not build_options(backend="torch-cclctl").staged  # relayed inside torch's backend
    monkeypatch.delenv("CCLCTL_STAGE")
    opts = build_options()
    assert opts.stage == "auto" and "stage" not in opts.to_dict()  # the JSON as before
    staged = build_options(stage="ALWAYS")
    assert BenchOptions.from_json(staged.to_json()) == staged and staged.staged


def test_bad_stage_on_the_command_line_is_exit_2() -> None:
    code, out, err = _run(["bench", "--stage", "sometimes"], timeout=30)
    assert code == 2 and not out
    assert err.strip().splitlines() == [
        "cclctl: error: --stage 'sometimes' is not one of auto, always, never"
    ]


@pytest.mark.timeout(120)
def test_stage_always_end_to_end_writes_the_columns_everywhere(tmp_path: Path) -> None:
    out_json, out_csv = tmp_path / "out.json", tmp_path / "out.csv"
    args = ["bench", "--stage", "always", "-g", "2", "-b", "1K", "-e", "64K", "-f", "64",
            "-n", "2", "-w", "1", "--collective", "all_reduce,all_gather",
            "-J", str(out_json), "--csv", str(out_csv)]  # fmt: skip
    code, out, err = _run(args, env={"CCLCTL_STAGE_CHUNK": "16K"}, timeout=100)
    assert code == 0, err
    assert "stage: always" in out and "relay out-of-place" in out
    doc = json.loads(out_json.read_text())
    assert doc["ok"] is True and doc["meta"]["stage"] == "always"
    assert len(doc["rows"]) == 4
    for row in doc["rows"]:
        for placement in ("out_of_place", "in_place"):
            assert row[placement]["#wrong"] == 0
            _sane(Timing.from_dict(row[placement]).relay)
    with out_csv.open() as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 4 and all(float(line["in_place_relay_efficiency"]) > 0 for line in lines)
