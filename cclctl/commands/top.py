"""`cclctl top`: every rank of a live job, one row each, the ones that look wrong first.

All the reading and judging is in :mod:`cclctl.live` (``cclctl diagnose hang --store`` uses
the same code); this module only draws: a rich Live table on a terminal, one table per
refresh when stdout is a pipe (like ``top -b``), or the JSON document with ``--json``.
"""

from __future__ import annotations

import json
import sys
import time

import typer
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cclctl.commands.checks import store_to_read
from cclctl.errors import ConfigError, StoreError, UsageError
from cclctl.live import table as rows_of
from cclctl.live.classify import DEFAULT_SLOW_S, DEFAULT_STALE_S, JobView, Thresholds, read_view
from cclctl.live.document import to_document
from cclctl.runtime.store import StoreClient, parse_address

HELP = (
    "Watch a live job: one row per rank, refreshed every --interval seconds.\n\n"
    "Reads the status every rank publishes to the job's store (about once a second) and shows "
    "host, pid, heartbeat age, state (ok, in collective, waiting, stale, missing, error), the "
    "collective in flight (comm, seq, op, size, age, the peer it waits on and for send or "
    "recv), the last bus bandwidth and error and retry counts. Ranks that look wrong come "
    "first and are highlighted: no status, a heartbeat older than --stale, a collective older "
    "than --slow, a failed collective, errors or hangs counted, or behind peers that wait for "
    "them.\n\n"
    "--once prints one table and exits; --json prints the cclctl.top document (version 1) "
    "and exits. Without --job the store must hold exactly one job. Ctrl-C quits."
)

#: A store that does not answer this fast is reported unreachable (exit 1), not waited for.
CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 10.0
#: Lines around the rows: header, the table's borders and column titles, the footer.
CHROME_LINES = 7
PIPE_WIDTH = 200
_STYLES = {"bad": "bold red", "warn": "yellow", "ok": ""}


def register(app: typer.Typer) -> None:
    app.command("top", help=HELP)(top)


def top(
    store: str | None = typer.Option(
        None,
        "--store",
        help="The job's store, HOST:PORT, as `cclctl launch` prints it \\[default: CCLCTL_STORE].",
        show_default=False,
    ),
    job: str | None = typer.Option(
        None, "--job", help="Job name \\[default: the only one in the store]."
    ),
    once: bool = typer.Option(False, "--once", help="Print one table and exit."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document and exit."),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between refreshes."),
    world_size: int | None = typer.Option(
        None, "--world-size", help="Ranks expected, when the job did not rendezvous here."
    ),
    stale: float = typer.Option(
        DEFAULT_STALE_S, "--stale", help="A heartbeat older than this (s) is stale."
    ),
    slow: float = typer.Option(
        DEFAULT_SLOW_S, "--slow", help="A collective older than this (s) looks stuck."
    ),
    rows: int | None = typer.Option(
        None, "--rows", help="Rank rows to show \\[default: what fits the terminal; all in a pipe]."
    ),
) -> None:
    address = store_to_read("top", store)
    _check(interval=interval, stale=stale, slow=slow, world_size=world_size, rows=rows)
    limits = Thresholds(stale_s=stale, slow_s=slow)
    client = _connect(address)
    try:
        view = read_view(client, job, world_size=world_size, thresholds=limits)
    except BaseException:
        client.close()
        raise
    with _Watch(client, view, world_size, limits) as watch:
        if (once or as_json) and view.world_size == 0:
            raise UsageError(f"job {view.job!r} has published no status to {view.address} yet")
        if as_json:
            sys.stdout.write(json.dumps(to_document(view), indent=2) + "\n")
            return
        console = _console()
        if once:
            console.print(render(view, rows if rows is not None else _fit(console)))
        elif console.is_terminal:
            watch.live(console, interval, rows)
        else:
            watch.batch(console, interval, rows)


def _check(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} must be positive, not {value!r}", flag=flag)


def _connect(address: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> StoreClient:
    try:
        host, port = parse_address(address)
    except StoreError as exc:
        raise ConfigError(f"--store: {exc}", flag="--store") from None
    return StoreClient(host, port, timeout_s=REQUEST_TIMEOUT_S, connect_timeout_s=connect_timeout_s)


def _console() -> Console:
    """Results go to stdout; in a pipe, wide enough that no column is squeezed away."""
    console = Console(highlight=False)
    if not console.is_terminal and console.width <= 80:
        console.width = PIPE_WIDTH
    return console


def _fit(console: Console, extra_lines: int = 0) -> int | None:
    """Rows that fit the terminal (at least a few), or all of them in a pipe."""
    if not console.is_terminal:
        return None
    return max(3, console.size.height - CHROME_LINES - extra_lines)


def render(view: JobView, max_rows: int | None, note: str = "") -> RenderableType:
    """Header, table of the rows that fit, and the line counting the rest."""
    model = rows_of.build_table(view, max_rows)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in model.columns:
        numeric = name in rows_of.NUMERIC or name.startswith("busbw")
        width = 40 if name == "state" else 24 if name in ("host", "comm") else None
        table.add_column(
            name,
            justify="right" if numeric else "left",
            no_wrap=True,
            max_width=width,
            overflow="ellipsis",
        )
    for row in model.rows:
        table.add_row(*row.cells, style=_STYLES[row.severity])
    parts: list[RenderableType] = [Text(model.header, style="bold")]
    if note:
        parts.append(Text(note, style="bold red"))
    parts.append(table)
    if model.footer:
        parts.append(Text(model.footer, style="dim"))
    return Group(*parts)


class _Watch:
    """The refresh loop: keeps the last good view on screen while the store is away."""

    def __init__(
        self, client: StoreClient, view: JobView, world_size: int | None, limits: Thresholds
    ) -> None:
        self.client: StoreClient | None = client
        self.address = client.address
        self.view = view
        self.world_size = world_size
        self.limits = limits
        self.note = ""  # why the view on screen is not fresh ("" when it is)

    def __enter__(self) -> _Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()

    def refresh(self) -> JobView:
        """Fetch a new view; on a store error keep the last one and say why in ``note``."""
        try:
            if self.client is None:
                self.client = _connect(self.address, connect_timeout_s=1.0)
            self.view = read_view(
                self.client, self.view.job, world_size=self.world_size, thresholds=self.limits
            )
            self.note = ""
        except StoreError as exc:
            if self.client is not None:
                self.client.close()
                self.client = None
            self.note = f"store unreachable, showing the last view: {exc}"
        return self.view

    def live(self, console: Console, interval: float, rows: int | None) -> None:
        """Redraw in place until Ctrl-C."""
        view = self.view
        with Live(console=console, auto_refresh=False) as live:
            try:
                while True:
                    fit = rows or _fit(console, extra_lines=1 if self.note else 0)
                    live.update(render(view, fit, self.note), refresh=True)
                    time.sleep(interval)
                    view = self.refresh()
            except KeyboardInterrupt:
                return

    def batch(self, console: Console, interval: float, rows: int | None) -> None:
        """Stdout is not a terminal: print a full table per refresh, like ``top -b``."""
        view = self.view
        try:
            while True:
                console.print(render(view, rows, self.note))
                time.sleep(interval)
                view = self.refresh()
        except KeyboardInterrupt:
            return
