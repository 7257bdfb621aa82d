"""What `cclctl top` shows in one refresh: the job's ranks classified and diagnosed
(:class:`Screen`), and how it is drawn (:func:`render`, in the rows that fit a terminal)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.text import Text

from cclctl.commands.diagnose_sources import no_cycle_collection
from cclctl.commands.drawn_table import Column, DrawnTable
from cclctl.diagnose.model import Options
from cclctl.diagnose.slow_model import SlowReport
from cclctl.diagnose_io.live import diagnose_live
from cclctl.diagnose_io.slow_inputs import slow_live
from cclctl.live import table as rows_of
from cclctl.live.agent_line import agent_lines
from cclctl.live.classify import classify
from cclctl.live.culprit import OK, SUSPECT, WAITING, WARN, Culprits, read_culprits
from cclctl.live.probe_line import probe_line, unreadable_line
from cclctl.live.rank_view import JobView, Thresholds
from cclctl.live.slow_cells import add_slow_columns
from cclctl.live.snapshot import JobStatuses, fetch
from cclctl.probe_record import ProbeRecord
from cclctl.store.kv import KeyValueStore

#: Lines around the rows: header, the table's borders and column titles, the footer.
CHROME_LINES = 7
_STYLES = {SUSPECT: "bold red", WAITING: "dim", WARN: "yellow", OK: ""}


@dataclasses.dataclass(frozen=True)
class Screen:
    """One refresh: every rank classified, and the diagnosis read onto the rows; ``slow``
    is ``diagnose slow --store``'s verdict for the same statuses (None before any)."""

    view: JobView
    culprits: Culprits
    slow: SlowReport | None = None
    probe: ProbeRecord | None = None  # the job's last probe, if it published one
    probe_error: str = ""  # why the job's probe document is unusable, if it is
    agents: tuple[str, ...] = ()  # host agents gone silent (their ranks publish directly)

    def probe_line(self) -> str | None:
        """The line about the last probe (80 columns), None without one."""
        if self.probe is None:
            return unreadable_line(self.probe_error) if self.probe_error else None
        return probe_line(self.probe, self.view.fetched_ns)


def read_screen(
    client: KeyValueStore,
    job: str | None,
    world_size: int | None,
    limits: Thresholds,
    say: Callable[[str], None] | None = None,
) -> Screen:
    """Fetch once; classify the ranks and diagnose the same statuses (no second fetch).

    The diagnosis is ``diagnose hang --store``'s, with --stale and --slow as its stale and
    stuck thresholds; none while no rank has published. Its UsageError (a --world-size
    below a rank seen) is the user's to fix, as in diagnose. ``say``: told what is read,
    then judged (the first screen's progress line).
    """
    with no_cycle_collection():
        statuses = fetch(client, job, say=say)
        if say is not None:
            say(f"judging {len(statuses.statuses):,} ranks")
        return screen_of(statuses, world_size, limits)


def screen_of(statuses: JobStatuses, world_size: int | None, limits: Thresholds) -> Screen:
    """Classify and diagnose fetched statuses (see :func:`read_screen`)."""
    view = classify(statuses, world_size=world_size, thresholds=limits)
    options = Options(stale_after_s=limits.stale_s, stuck_after_s=limits.slow_s)
    published = bool(statuses.statuses or statuses.bad)
    diagnosis = diagnose_live(statuses, world_size, options) if published else None
    slow = slow_live(statuses) if published else None
    culprits = read_culprits(diagnosis, view)
    agents = tuple(agent_lines(statuses))
    return Screen(view, culprits, slow, statuses.probe, statuses.probe_error, agents)


def fit_rows(console: Console, screen: Screen, extra_lines: int = 0) -> int | None:
    """Rows that fit the terminal under the verdict lines (at least a few), or all of them
    in a pipe.
    """
    if not console.is_terminal:
        return None
    width = max(1, console.width)
    lines = [f"{label}: {words}" for label, words in rows_of.verdict_lines(screen.culprits)]
    lines += screen.culprits.waiting_lines
    lines += [line] if (line := screen.probe_line()) else []
    lines += screen.agents
    wrapped = sum(-(-len(line) // width) for line in lines)
    return max(3, console.size.height - CHROME_LINES - wrapped - extra_lines)


def render(screen: Screen, max_rows: int | None, note: str = "", width: int = 0) -> RenderableType:
    """Header, verdicts, who waits on them, the table of the rows that fit (in ``width``
    characters; 0: every column) and the line counting the rest.
    """
    slow = len(screen.slow.findings) if screen.slow is not None else 0
    model = add_slow_columns(
        rows_of.build_table(screen.view, screen.culprits, max_rows, slow), screen.slow
    )
    if width > 0:
        model = model.fit(width)
    columns = [
        Column(
            name,
            right=name in rows_of.NUMERIC or name.startswith("busbw"),
            wrap=rows_of.STATE_MAX if name == "state" else 0,
        )
        for name in model.columns
    ]
    table = DrawnTable(columns, [(row.cells, _STYLES[row.severity]) for row in model.rows])
    parts: list[RenderableType] = [Text(model.header, style="bold")]
    if note:
        parts.append(Text(note, style="bold red"))
    for label, words in model.verdicts:
        parts.append(Text(f"{label}: ", style="bold red").append(words, style="red"))
    parts += [Text(line, style="dim") for line in model.waiting]
    probe = screen.probe_line()
    if probe is not None:
        found = screen.probe_error != "" or (screen.probe is not None and not screen.probe.ok)
        parts.append(Text(probe, style="yellow" if found else "dim"))
    parts += [Text(line, style="yellow") for line in screen.agents]
    parts.append(table)
    if model.footer:
        parts.append(Text(model.footer, style="dim"))
    return Group(*parts)
