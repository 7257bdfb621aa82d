"""`cclctl top`: every rank of a live job, one row each, the suspects first.

All the reading and judging is elsewhere: :mod:`cclctl.live` classifies each rank and
:func:`cclctl.diagnose_io.live.diagnose_live` gives the verdict, the very one ``cclctl
diagnose hang --store`` prints. This module only draws: a rich Live table on a terminal, one
table per refresh when stdout is a pipe (like ``top -b``), or the JSON document with
``--json``. Columns that do not fit the terminal are dropped whole (see
:data:`cclctl.live.table.PRIORITY`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import typer
from rich.console import Console
from rich.live import Live

from cclctl.commands.checks import store_to_read
from cclctl.commands.diagnose_sources import reading
from cclctl.commands.store_access import connect, store_option
from cclctl.commands.top_screen import Screen, fit_rows, read_screen, render
from cclctl.errors import ConfigError, StoreError, UsageError
from cclctl.limits import MAX_WORLD_SIZE
from cclctl.live.document import dumps, to_document
from cclctl.live.rank_view import DEFAULT_SLOW_S, DEFAULT_STALE_S, Thresholds
from cclctl.store.kv import KeyValueStore

HELP = (
    "Watch a live job: one row per rank, refreshed every --interval seconds.\n\n"
    "Reads the status every rank publishes to the job's store (about once a second) and shows "
    "host, pid, heartbeat age, state (ok, in collective, waiting, stale, missing, error, done: it "
    "finished cleanly), the "
    "collective in flight (comm, seq, op, size, age, the peer it waits on and for send or "
    "recv), the last bus bandwidth and error and retry counts.\n\n"
    "Above the table is the verdict of `cclctl diagnose hang --store` for the same statuses. "
    'Its suspects come first, in red, with the reason in words ("never entered all_reduce '
    'seq 155", "stopped (SIGSTOP)", "dead"); the ranks inside the call they block are '
    'dimmed, summed up in one line ("ranks 0-1,3 wait on rank 2 ...") and show the suspect '
    "under 'waiting on' as \"2 (inferred)\" where their own record names no peer (gloo, "
    "NCCL). Other ranks that look wrong (a heartbeat older than --stale, a collective older "
    "than --slow, a failed call, hangs or errors counted beyond the calls a retry re-ran) "
    "follow in yellow.\n\n"
    "Below it, `cclctl diagnose slow --store`'s verdict for the same statuses (a slow rank, "
    "link or host, in words; its suspects first when nothing hangs), whose figures fill two "
    "columns: 'entry lag', how long after the median each rank enters its collectives, and "
    "'wait share', the share of the time it spends inside them (a straggler enters last and "
    "waits least).\n\n"
    "Columns that do not fit the terminal are dropped whole (bus bandwidth, counts, size, host "
    "and pid go first; rank and state always stay); op names shorten first (ar, ag, rs, a2a, "
    "bcast).\n\n"
    "--once prints one table and exits; --json prints the cclctl.top document (version 1) "
    "and exits. Without --job the store must hold exactly one job. Ctrl-C (SIGINT) or SIGTERM "
    "quits, even where the shell that started top ignores Ctrl-C (a background job)."
)

#: the width of top's output in a pipe or a log (a terminal's own width otherwise)
PIPE_WIDTH = 200


def register(app: typer.Typer) -> None:
    app.command("top", help=HELP)(top)


def top(
    store: str | None = store_option(),
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
        DEFAULT_STALE_S, "--stale", help="A heartbeat older than this (s) is stale (as diagnose's)."
    ),
    slow: float = typer.Option(
        DEFAULT_SLOW_S,
        "--slow",
        help="A collective older than this (s) looks stuck (diagnose's --stuck-after).",
    ),
    rows: int | None = typer.Option(
        None, "--rows", help="Rank rows to show \\[default: what fits the terminal; all in a pipe]."
    ),
) -> None:
    address = store_to_read("top", store)
    _check(interval=interval, stale=stale, slow=slow, world_size=world_size, rows=rows)
    limits = Thresholds(stale_s=stale, slow_s=slow)
    client = connect(address)
    try:
        with reading(address) as say:
            screen = read_screen(client, job, world_size, limits, say)
    except BaseException:
        client.close()
        raise
    view = screen.view
    with _Watch(client, screen, world_size, limits) as watch:
        if (once or as_json) and view.world_size == 0:
            raise UsageError(f"job {view.job!r} has published no status to {view.address} yet")
        if as_json:
            doc = to_document(view, screen.culprits)
            doc["slow"] = screen.slow.to_dict() if screen.slow is not None else None
            doc["probe"] = _probe_document(screen)
            sys.stdout.write(dumps(doc) + "\n")
            return
        console = _console()
        if once:
            fit = rows if rows is not None else fit_rows(console, screen)
            console.print(render(screen, fit, width=console.width))
        elif console.is_terminal:
            watch.live(console, interval, rows)
        else:
            watch.batch(console, interval, rows)


def _probe_document(screen: Screen) -> dict[str, object] | None:
    """``--json``'s ``probe``: the last probe's time, links, findings and top's line."""
    probe = screen.probe
    if probe is None:
        return None
    return {
        "time_ns": probe.time_ns,
        "links": probe.links_total,
        "findings": [{"kind": f.kind, "text": f.text} for f in probe.findings],
        "line": screen.probe_line(),
    }


def _check(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} must be positive, not {value!r}", flag=flag)
    size = values.get("world_size")
    if size is not None and size > MAX_WORLD_SIZE:
        raise ConfigError(
            f"--world-size {size:g} is over the limit of {MAX_WORLD_SIZE:,} ranks",
            flag="--world-size",
        )


def _console() -> Console:
    """Results go to stdout; in a pipe, wide enough that no column is squeezed away."""
    console = Console(highlight=False)
    if not console.is_terminal and console.width <= 80:
        console.width = PIPE_WIDTH
    return console


class _Watch:
    """The refresh loop: keeps the last good screen while the store is away.

    It ends on SIGINT or SIGTERM through its own handlers, which only set a flag and write
    a byte to a pipe (no lock: a handler runs on the main thread, maybe inside a lock it
    holds); between refreshes it waits in ``select`` on that pipe, so the wait ends the
    moment the signal comes. The signal is never lost, whatever the main thread was doing
    when it came (a KeyboardInterrupt raised inside a finaliser is only logged), nor ignored
    because the shell that started top ignores Ctrl-C (Python then raises no
    KeyboardInterrupt at all).
    """

    QUIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(
        self, client: KeyValueStore, screen: Screen, world_size: int | None, limits: Thresholds
    ) -> None:
        self.client: KeyValueStore | None = client
        self.address = client.address
        self.screen = screen
        self.world_size = world_size
        self.limits = limits
        self.note = ""  # why the screen is not fresh ("" when it is)
        self.stopped = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def __enter__(self) -> _Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self.client is not None:
            self.client.close()

    @contextlib.contextmanager
    def _quit_on_signals(self) -> Iterator[None]:
        """While the loop runs, SIGINT and SIGTERM set :attr:`stopped` (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._quit) for sig in self.QUIT_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _quit(self, signum: int, frame: FrameType | None) -> None:
        self.stopped = True
        with contextlib.suppress(OSError):  # full: a byte is there already
            os.write(self._wake_w, b"q")

    def pause(self, interval: float) -> bool:
        """Wait ``interval`` seconds between refreshes; True (at once) once told to quit."""
        if not self.stopped:
            select.select([self._wake_r], [], [], interval)
        return self.stopped

    def refresh(self) -> Screen:
        """Fetch a new screen; on a store error keep the last one and say why in ``note``."""
        try:
            if self.client is None:
                self.client = connect(self.address, connect_timeout_s=1.0)
            job = self.screen.view.job
            self.screen = read_screen(self.client, job, self.world_size, self.limits)
            self.note = ""
        except StoreError as exc:
            if self.client is not None:
                self.client.close()
                self.client = None
            self.note = f"store unreachable, showing the last view: {exc}"
        except UsageError as exc:  # the job's documents changed under us (e.g. another job's)
            self.note = f"cannot read the job now, showing the last view: {exc}"
        return self.screen

    def live(self, console: Console, interval: float, rows: int | None) -> None:
        """Redraw in place until Ctrl-C."""
        screen = self.screen
        with self._quit_on_signals(), Live(console=console, auto_refresh=False) as live:
            while not self.stopped:
                fit = rows or fit_rows(console, screen, extra_lines=1 if self.note else 0)
                live.update(render(screen, fit, self.note, console.width), refresh=True)
                if self.pause(interval):
                    return
                screen = self.refresh()

    def batch(self, console: Console, interval: float, rows: int | None) -> None:
        """Stdout is not a terminal: print a full table per refresh, like ``top -b``."""
        screen = self.screen
        with self._quit_on_signals():
            while not self.stopped:
                console.print(render(screen, rows, self.note, console.width))
                if self.pause(interval):
                    return
                screen = self.refresh()
