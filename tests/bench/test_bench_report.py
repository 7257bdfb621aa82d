"""The bench report: nccl-tests' table (golden text), the JSON document and CSV."""

from __future__ import annotations

import csv
import io
import json

import pytest

from cclctl.benchmark import report
from cclctl.benchmark.options import BenchOptions
from cclctl.benchmark.results import BENCH_SCHEMA, RankInfo, Row, RunMeta, Timing
from cclctl.errors import BadInput, CheckFailed


def _meta(min_busbw: float | None = 1.0) -> RunMeta:
    opts = BenchOptions(
        ops=("all_reduce", "sendrecv"),
        minbytes=8,
        maxbytes=1 << 20,
        iters=20,
        warmup_iters=5,
        min_busbw=min_busbw,
        command=("cclctl", "bench", "--collective", "all_reduce,sendrecv"),
    )
    ranks = (RankInfo(0, "node-a", 4242), RankInfo(1, "node-b", 4243))
    return RunMeta(
        2, ranks, "cclctl", "0.1.0", opts.to_dict(), "2024-05-01T12:00:00+00:00", "later"
    )


def _rows(wrong: int = 3) -> list[Row]:
    return [
        Row("all_reduce", 8, 2, "float", "sum", -1, Timing(12.345, 0.000648, 0.000648, 0),
            Timing(11.0, 0.00073, 0.00073, 0)),
        Row("all_reduce", 1048576, 262144, "float", "sum", -1, Timing(1234.56, 0.849, 0.849, 0),
            Timing(23456.7, 0.0447, 0.0447, wrong)),
        Row("sendrecv", 1048576, 262144, "float", "none", -1, Timing(800.0, 1.31, 1.31, 0),
            Timing(790.25, 1.33, 1.33, None)),
    ]  # fmt: skip


GOLDEN = """\
# cclctl bench 0.1.0: all_reduce, sendrecv
# nRanks 2 minBytes 8 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 average: 1(avg) timeout: default backend: cclctl
#
# Using ranks
#  Rank  0 Pid   4242 on node-a
#  Rank  1 Pid   4243 on node-b
#
# Collective test: all_reduce
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    12.35    0.00    0.00      0    11.00    0.00    0.00      0
     1048576        262144     float     sum      -1   1234.6    0.85    0.85      0    23457    0.04    0.04      3
# Out of bounds values : 1 FAILED
# Avg bus bandwidth    : 0.223769 FAILED
#
# Collective test: sendrecv
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float    none      -1    800.0    1.31    1.31      0    790.2    1.33    1.33    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 1.32 OK
#
"""  # noqa: E501


def test_table_matches_golden_text() -> None:
    assert report.render_table(_meta(), _rows()) == GOLDEN


def test_rows_line_up_with_nccl_tests_columns() -> None:
    # all_reduce_perf's own line for this data, character for character.
    row = Row("sendrecv", 134217728, 33554432, "float", "sum", -1,
              Timing(1211.2, 110.81, 110.81, 0), Timing(1211.8, 110.76, 110.76, None))  # fmt: skip
    assert report.format_row(row) == (
        "   134217728      33554432     float     sum      -1   1211.2  110.81  110.81      0"
        "   1211.8  110.76  110.76    N/A"
    )


@pytest.mark.parametrize(
    ("time_us", "text"),
    [(5.0, "   5.00"), (99.994, "  99.99"), (100.0, "  100.0"), (9999.9, " 9999.9"),
     (10000.0, "  10000"), (1234567.0, "1234567")],
)  # fmt: skip
def test_time_precision_follows_nccl_tests(time_us: float, text: str) -> None:
    assert report.format_time(time_us) == text


def test_no_floor_means_no_verdict_on_the_average() -> None:
    text = report.render_table(_meta(min_busbw=None), _rows(wrong=0))
    assert "# Avg bus bandwidth    : 0.223769\n" in text
    assert "# Out of bounds values : 0 OK" in text


def test_json_document_carries_rows_with_table_names_and_metadata() -> None:
    doc = json.loads(json.dumps(report.to_document(_meta(), _rows())))
    assert doc["schema"] == BENCH_SCHEMA and doc["version"] == 1
    meta = doc["meta"]
    keys = "world_size hosts backend version dtype ops started_at finished_at command redop root"
    for key in [*keys.split(), "minbytes", "maxbytes", "iters", "warmup_iters", "check"]:
        assert key in meta, key
    assert meta["hosts"] == ["node-a", "node-b"]
    assert meta["command"] == ["cclctl", "bench", "--collective", "all_reduce,sendrecv"]
    assert meta["ranks"][1] == {"rank": 1, "host": "node-b", "pid": 4243}
    assert len(doc["rows"]) == 3
    row = doc["rows"][1]
    assert {k: row[k] for k in ("op", "size", "count", "type", "redop", "root")} == {
        "op": "all_reduce", "size": 1048576, "count": 262144, "type": "float", "redop": "sum",
        "root": -1,
    }  # fmt: skip
    assert row["in_place"] == {"time": 23456.7, "algbw": 0.0447, "busbw": 0.0447, "#wrong": 3}
    assert doc["rows"][2]["in_place"]["#wrong"] is None
    assert doc["summary"]["all_reduce"] == {
        "avg_busbw": pytest.approx(0.223769, rel=1e-5), "out_of_bounds": 1, "wrong": 3,
    }  # fmt: skip
    assert doc["ok"] is False and doc["complete"] is True
    assert Row.from_dict(doc["rows"][1]) == _rows()[1]


def test_csv_has_one_line_per_row() -> None:
    lines = list(csv.DictReader(io.StringIO(report.render_csv(_rows()))))
    assert [line["op"] for line in lines] == ["all_reduce", "all_reduce", "sendrecv"]
    assert lines[1]["in_place_#wrong"] == "3" and lines[2]["in_place_#wrong"] == ""
    assert float(lines[0]["out_of_place_time"]) == 12.345
    assert list(lines[0]) == list(report.CSV_COLUMNS)


def test_failures_name_wrong_results_and_the_bandwidth_floor() -> None:
    with pytest.raises(CheckFailed) as info:
        report.raise_on_failure(_meta(min_busbw=1.0), _rows(wrong=3))
    message = str(info.value)
    assert info.value.exit_code == 4
    assert "all_reduce: 3 wrong elements" in message
    assert "below --min-busbw 1" in message
    assert "sendrecv" not in message  # 1.32 GB/s meets the floor
    report.raise_on_failure(_meta(min_busbw=None), _rows(wrong=0))  # nothing to report


def test_malformed_rows_are_bad_input() -> None:
    with pytest.raises(BadInput):
        Row.from_dict({"op": "all_reduce"})
    with pytest.raises(BadInput):
        Row.from_dict(["not", "a", "row"])
