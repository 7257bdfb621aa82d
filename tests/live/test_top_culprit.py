"""`cclctl top` points at the culprit: the diagnosis' suspects first, in red, with the reason,
the ranks waiting on them dimmed and summed up, and a table that fits 80 columns without a
cut number or op name. The verdict is the one `cclctl diagnose hang --store` gives.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from rich.console import Console
from test_top import JOB, in_flight, put, rendezvous, status, top_json

from cclctl.commands.top_screen import Screen, render, screen_of
from cclctl.diagnose.model import Options
from cclctl.live import table
from cclctl.live.rank_view import DEFAULT_SLOW_S, DEFAULT_STALE_S, Thresholds
from cclctl.live.snapshot import JobStatuses, parse
from cclctl.revocation import Revocation
from cclctl.store.client import StoreClient, StoreServer

WIDTHS = (80, 120, 200)
COMM = "0:0-3"
FULL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall", "send", "recv")
BOLD_RED, DIM = "\x1b[1;31m", "\x1b[2m"


def here(raw: bytes, pid: int) -> bytes:
    """A status document moved onto this host under ``pid``, written now."""
    doc = json.loads(raw)
    doc.update(host=socket.gethostname(), pid=pid, time_ns=time.time_ns())
    return json.dumps(doc).encode()


def hung_job(seq: int, rank2: bytes | None = None) -> dict[int, bytes]:
    """Ranks 0, 1 and 3 inside all_reduce ``seq`` for 12 s, their records naming no peer
    (as gloo's do); rank 2 completed ``seq - 1`` and never entered ``seq``."""
    docs = {
        r: status(r, started=seq, completed=seq - 1, inflight=in_flight(seq, 12.0))
        for r in (0, 1, 3)
    }
    docs[2] = rank2 or status(2, started=seq - 1, completed=seq - 1)
    return docs


def statuses_of(docs: dict[int, bytes]) -> JobStatuses:
    out = parse(JOB, "127.0.0.1:1", {f"cclctl/{JOB}/status/{r}": v for r, v in docs.items()})
    out.rdzv_world_size = 4
    return out


def screen(docs: dict[int, bytes]) -> Screen:
    return screen_of(statuses_of(docs), None, Thresholds())


def draw(shown: Screen, width: int) -> tuple[str, str, list[str]]:
    """The screen as a person sees it at ``width`` columns: plain text, text with colour
    codes, and the table's lines (column titles first)."""
    console = Console(
        width=width, record=True, highlight=False, force_terminal=True, color_system="standard"
    )
    console.print(render(shown, None, width=width))
    plain = console.export_text(clear=False)
    styled = console.export_text(styles=True)
    lines = plain.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("──"))
    return plain, styled, [lines[rule - 1], *lines[rule + 1 :]]


def check_layout(shown: Screen, width: int) -> tuple[str, str, list[str]]:
    """What holds at every width: nothing wider than the screen, nothing cut, rank first,
    each shown cell whole in its row, ops either all full or all in their short form."""
    plain, styled, rows = draw(shown, width)
    assert all(len(line) <= width for line in plain.splitlines()), plain
    assert "…" not in plain
    fitted = table.build_table(shown.view, shown.culprits).fit(width)
    assert fitted.columns[0] == "rank" and rows[0].split()[0] == "rank"
    assert [line.split()[0] for line in rows[1:]] == [str(r.rank) for r in fitted.rows]
    for line, row in zip(rows[1:], fitted.rows, strict=True):
        for cell in row.cells:
            assert cell in line, (cell, line)
    if "op" in fitted.columns:
        ops = {r.cells[fitted.columns.index("op")] for r in fitted.rows} - {"-"}
        short = set(table.SHORT_OPS.values())
        assert ops <= set(FULL_OPS) or ops <= short, ops
    if width >= 200:
        assert len(fitted.columns) == len(table.COLUMNS)
    return plain, styled, rows


def line_of(rows: list[str], rank: int) -> str:
    return next(line for line in rows[1:] if line.split()[0] == str(rank))


def styled_line(styled: str, rank: int) -> str:
    """The row of ``rank`` with its colour codes (the first token after them is the rank)."""
    for line in styled.splitlines():
        if line.split("\x1b[0m")[0].split("m", 1)[-1].split()[:1] == [str(rank)]:
            return line
    raise AssertionError(f"no row for rank {rank}")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_rank_that_never_entered(width: int) -> None:
    shown = screen(hung_job(155))
    plain, styled, rows = check_layout(shown, width)
    assert rows[1].split()[0] == "2" and "never entered all_reduce seq 155" in rows[1]
    assert "NOT ENTERED: rank 2 never entered all_reduce seq 155 of comm 0:0-3" in plain
    assert "ranks 0-1,3 wait on rank 2 in all_reduce seq 155" in plain
    assert [line.split()[0] for line in rows[1:]] == ["2", "0", "1", "3"]
    for rank in (0, 1, 3):
        assert "2 (inferred)" in line_of(rows, rank)  # gloo-like records name no peer
        assert DIM in styled_line(styled, rank)
    assert BOLD_RED in styled_line(styled, 2)
    if width == 80:  # what fits: the essentials, nothing half-shown
        assert table.build_table(shown.view, shown.culprits).fit(80).columns == (
            "rank",
            "state",
            "seq",
            "op",
            "age",
            "waiting on",
        )


@pytest.fixture
def stopped_pid() -> Iterator[int]:
    """A real process of this host, stopped as by SIGSTOP (or Ctrl-Z, or a debugger)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        proc.send_signal(19)  # SIGSTOP
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the process never stopped"
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process of this host that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


@pytest.mark.timeout(60)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("fate", ["stopped", "dead"])
def test_a_stopped_or_dead_rank(fate: str, width: int, request: pytest.FixtureRequest) -> None:
    pid = request.getfixturevalue(f"{fate}_pid")
    shown = screen(hung_job(7, here(status(2, started=6, completed=6), pid)))
    plain, styled, rows = check_layout(shown, width)
    reason = {"stopped": "stopped (SIGSTOP)", "dead": "dead"}[fate]
    assert rows[1].split()[0] == "2" and reason in rows[1]
    assert f"{fate.upper()}: rank 2 is {reason}" in plain
    assert f"rank 2 (pid {pid} on {socket.gethostname()})" in plain
    assert "ranks 0-1,3 wait on rank 2 in all_reduce seq 7" in plain
    assert BOLD_RED in styled_line(styled, 2) and DIM in styled_line(styled, 3)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_healthy_job(width: int) -> None:
    shown = screen({r: status(r, started=10, completed=10) for r in range(4)})
    plain, styled, rows = check_layout(shown, width)
    assert shown.culprits.diagnosis is not None and not shown.culprits.diagnosis.fault
    assert [line.split()[0] for line in rows[1:]] == ["0", "1", "2", "3"]
    assert BOLD_RED not in styled and DIM not in styled and "wait on" not in plain
    assert plain.splitlines()[0].startswith(f"job {JOB} · 4/4 ranks · all look fine")


def test_ops_shorten_before_their_column_goes() -> None:
    shown = screen(hung_job(155))
    full = table.build_table(shown.view, shown.culprits)
    widths = {
        name: max(len(name), *(len(r.cells[i]) for r in full.rows))
        for i, name in enumerate(full.columns)
    }
    # one character too narrow for "all_reduce" after rank, state and seq; room for "ar"
    gaps = 3 * table.COLUMN_GAP
    width = widths["rank"] + widths["state"] + widths["seq"] + len("all_reduce") + gaps - 1
    tight = full.fit(width)
    assert tight.columns[:4] == ("rank", "state", "seq", "op")
    assert {r.cells[3] for r in tight.rows} == {"-", "ar"}  # every row alike
    roomy = full.fit(80)
    assert {r.cells[roomy.columns.index("op")] for r in roomy.rows} == {"-", "all_reduce"}
    assert full.fit(1).columns == ("rank", "state")  # never fewer: the state wraps instead


def test_a_long_error_wraps_and_keeps_the_other_columns() -> None:
    failed = in_flight(9, 1.0, state="failed", error="peer rank 3 closed the connection " * 3)
    docs = {r: status(r, started=9, completed=9) for r in range(4)}
    docs[1] = status(1, started=9, completed=8, inflight=failed)
    shown = screen(docs)
    plain, _, _ = draw(shown, 80)
    assert "…" not in plain and all(len(line) <= 80 for line in plain.splitlines())
    flat = " ".join(plain.split())
    assert "peer rank 3 closed the connection peer rank 3 closed the connection" in flat
    assert {"rank", "state", "seq", "op"} <= set(
        table.build_table(shown.view, shown.culprits).fit(80).columns
    )


def test_thresholds_are_diagnose_s() -> None:
    """top's --stale and --slow default to diagnose hang's --stale and --stuck-after."""
    assert (
        Options().stale_after_s,
        Options().stuck_after_s,
    ) == (DEFAULT_STALE_S, DEFAULT_SLOW_S)


# Both reads allow fresh statuses to age: on a loaded machine starting each command takes
# seconds, and a status turned stale between the two reads changes the verdict.
STALE_SLACK = ["--stale", "600"]


def diagnose_json(address: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", "--store", address, "--json"]
    cmd += STALE_SLACK
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 3), out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def without_evidence(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Verdicts minus their evidence, whose ages move between two reads of a live job."""
    return [{k: v for k, v in verdict.items() if k != "evidence"} for verdict in doc["verdicts"]]


@pytest.mark.timeout(120)
def test_the_verdict_is_diagnose_s(
    server: StoreServer, client: StoreClient, stopped_pid: int
) -> None:
    """For the same statuses in a real store, `top --json` carries the verdict `diagnose hang
    --store --json` prints, and its table order and highlights follow that verdict."""
    rendezvous(client, 4)
    for docs, seq in (
        (hung_job(155), 155),
        (hung_job(7, here(status(2, started=6, completed=6), stopped_pid)), 7),
        ({r: status(r, started=10, completed=10) for r in range(4)}, None),
    ):
        for rank, raw in docs.items():
            put(client, rank, raw)
        shown = top_json(server.address, *STALE_SLACK)
        expected = diagnose_json(server.address)
        assert shown["diagnosis"]["schema"] == "cclctl.diagnosis"
        assert without_evidence(shown["diagnosis"]) == without_evidence(expected)
        suspects = [s["rank"] for v in expected["verdicts"] for s in v["suspect_ranks"]]
        assert suspects == ([2] if seq else [])
        assert [r["rank"] for r in shown["ranks"] if r["highlight"] == "suspect"] == suspects
        assert [r["rank"] for r in shown["ranks"]][: len(suspects)] == suspects
        assert [r["rank"] for r in shown["ranks"] if r["waits_on"] == [2]] == (
            [0, 1, 3] if seq else []
        )
        waiting = [f"ranks 0-1,3 wait on rank 2 in all_reduce seq {seq}"] if seq else []
        assert shown["waiting"] == waiting


def adopted(raw: bytes, **fields: Any) -> bytes:
    """A status document with ``fields`` added (``revoke``, ``finished``)."""
    return json.dumps(json.loads(raw) | fields).encode()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_revoke_records_origin_is_the_culprit(width: int) -> None:
    """Rank 2 died (no status any more); the others adopted the record naming it."""
    record = Revocation("died", 2, "SIGKILL", "node-1", 1002, COMM, 0, 7, "all_reduce", "", 0)
    docs = {r: adopted(raw, revoke=record.to_dict()) for r, raw in hung_job(7).items() if r != 2}
    shown = screen(docs)
    plain, styled, rows = check_layout(shown, width)
    assert [(v.kind, v.ranks, v.origin) for v in shown.culprits.faults] == [("dead", "2", True)]
    assert "DEAD: rank 2 is dead: SIGKILL (seen by rank 0)" in plain
    assert rows[1].split()[0] == "2" and "dead" in rows[1]
    assert "ranks 0-1,3 wait on rank 2 in all_reduce seq 7" in plain
    assert BOLD_RED in styled_line(styled, 2) and DIM in styled_line(styled, 3)


def test_a_finished_rank_is_done_not_stale_or_missing() -> None:
    docs = {r: status(r, started=10, completed=10) for r in range(3)}
    docs[3] = adopted(status(3, started=10, completed=10, age_s=120), finished=True)
    shown = screen(docs)
    assert shown.culprits.diagnosis is not None and not shown.culprits.diagnosis.fault
    views = {r.rank: r for r in shown.view.ranks}
    assert (views[3].state, views[3].flags, views[3].wrong) == ("done", (), False)
    assert "done" in line_of(check_layout(shown, 120)[2], 3)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    ("counter", "column", "rank", "count"),
    [("retries", "retries", 0, 3), ("link_resumes", "resumes", 1, 2)],
    ids=["retried", "resumed"],
)
def test_ridden_link_faults_show_beside_the_culprit(
    width: int, counter: str, column: str, rank: int, count: int
) -> None:
    """A retried call, or a link made again after a reset, moves its column up (after the
    culprit's own columns; the other one, all 0, stays where it was), and the screen still
    fits with the suspect first and its reason whole; a calm job keeps both low."""
    docs = hung_job(7)
    docs[rank] = status(
        rank, started=7, completed=6, inflight=in_flight(7, 12.0), counters={counter: count}
    )
    shown = screen(docs)
    _, _, rows = check_layout(shown, width)
    fitted = table.build_table(shown.view, shown.culprits).fit(width)
    assert column in fitted.columns and column in rows[0].split(), rows[0]
    assert rows[1].split()[0] == "2" and "never entered all_reduce seq 7" in rows[1]
    if width >= 200:  # every column, each under its own title
        assert fitted.columns[-6:] == (
            "waiting on", "busbw GB/s all_reduce", "errors", "retries", "resumes", "store"
        )  # fmt: skip
    at = fitted.columns.index(column)
    expected = {r: str(count) if r == rank else "0" for r in range(4)}
    assert {row.rank: row.cells[at] for row in fitted.rows} == expected
    calm = screen(hung_job(7))
    assert not {"retries", "resumes"} & set(
        table.build_table(calm.view, calm.culprits).fit(80).columns
    )


def test_errors_a_retry_re_ran_do_not_make_a_rank_look_wrong() -> None:
    """A job that rode through a link fault (each rank's failed attempt re-run by a retry)
    is all fine; an error beyond the calls retries re-ran still flags its rank."""
    docs = {r: status(r, started=10, completed=10, counters={"errors": 2, "retries": 2})
            for r in range(4)}  # fmt: skip
    healed = screen(docs).view
    assert [(r.rank, r.flags, r.errors) for r in healed.ranks] == [(r, (), 2) for r in range(4)]
    assert healed.wrong == 0
    docs[3] = status(3, started=10, completed=10, counters={"errors": 3, "retries": 2})
    one_more = {r.rank: r.flags for r in screen(docs).view.ranks}
    assert one_more == {0: (), 1: (), 2: (), 3: ("errors",)}
