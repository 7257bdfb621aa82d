"""The relay's columns of a staged bench report (``--stage always``): per placement, the
d2h, collective and h2d time per call (microseconds) and ``relay_efficiency``.

They follow nccl-tests' columns, so an unstaged report is nccl-tests' table unchanged and
a staged one is that table with these columns on the right (a placement the relay does
not run, in-place or out-of-place sendrecv, shows ``N/A``). CSV gets the same columns
after its own, JSON the placement's ``stages`` and ``relay_efficiency``
(:meth:`~cclctl.benchmark.results.Timing.to_dict`).
"""

from __future__ import annotations

from cclctl.benchmark.results import RelayTiming, Row, RunMeta, Timing

_PLACEMENTS = ("out_of_place", "in_place")
_CELLS = "  %7s  %7s  %7s  %5s"
_WIDTH = len(_CELLS % ("", "", "", ""))
_NAMES = ("d2h", "coll", "h2d", "eff")
_UNITS = ("(us)", "(us)", "(us)", "")

#: The CSV columns a staged report adds, per placement.
CSV_COLUMNS = tuple(
    f"{placement}_{name}"
    for placement in _PLACEMENTS
    for name in ("d2h_us", "collective_us", "h2d_us", "relay_efficiency")
)


def is_staged(meta: RunMeta) -> bool:
    """Whether the run relayed its calls (cclctl's runtime under ``CCLCTL_STAGE=always``),
    from its options, which the parent has before any rank describes the run."""
    opts = meta.options
    return opts.get("backend", "cclctl") == "cclctl" and opts.get("stage") == "always"


def header_cells() -> tuple[str, str, str]:
    """What each of the table's three header lines gains: group names, names, units."""
    groups = "".join(f"{'relay ' + p.replace('_', '-'):^{_WIDTH}}" for p in _PLACEMENTS)
    return groups.rstrip(), (_CELLS % _NAMES) * 2, ((_CELLS % _UNITS) * 2).rstrip()


def _time(us: float) -> str:
    """Microseconds as the table's time column has them (report.format_time's precision)."""
    return f"{us:7.0f}" if us >= 10000.0 else f"{us:7.1f}" if us >= 100.0 else f"{us:7.2f}"


def _format(relay: RelayTiming | None) -> str:
    if relay is None:
        return _CELLS % ("N/A", "N/A", "N/A", "N/A")
    times = (_time(value) for value in (relay.d2h_us, relay.collective_us, relay.h2d_us))
    return _CELLS % (*times, f"{relay.efficiency:5.2f}")


def row_cells(row: Row) -> str:
    """The table line's relay cells, out-of-place then in-place."""
    return "".join(_format(timing.relay) for timing in row.timings)


def _csv(timing: Timing) -> list[object]:
    relay = timing.relay
    if relay is None:
        return ["", "", "", ""]
    return [relay.d2h_us, relay.collective_us, relay.h2d_us, relay.efficiency]


def csv_cells(row: Row) -> list[object]:
    """A CSV line's relay cells, in :data:`CSV_COLUMNS` order (empty where not relayed)."""
    return [*_csv(row.out_of_place), *_csv(row.in_place)]
