"""Robust statistics for the slow-job analysis: medians and the median absolute deviation.

Means and standard deviations let one long step (a GC pause, a checkpoint) move the
reference it is judged against; the median and the MAD do not, so an outlier is measured
against what most ranks or links do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: The MAD of a normal sample times this estimates its standard deviation.
MAD_SCALE = 1.4826


def median(values: Iterable[float]) -> float:
    """The median (of an even count, the mean of the middle two, as ``statistics.median``
    gives it); 0.0 for no values. Inline rather than ``statistics.median``: the analysis of
    100,000 ranks takes hundreds of thousands of them."""
    data = sorted(values)
    n = len(data)
    if not n:
        return 0.0
    i = n // 2
    return float(data[i]) if n % 2 else float((data[i - 1] + data[i]) / 2)


def sorted_median(ordered: Sequence[float], start: int = 0) -> float:
    """:func:`median` of ``ordered[start:]`` where ``ordered`` is sorted already: no copy and
    no sort (a job's links, judged host by host, share one sorted list)."""
    n = len(ordered) - start
    if n <= 0:
        return 0.0
    i = start + n // 2
    return float(ordered[i]) if n % 2 else float((ordered[i - 1] + ordered[i]) / 2)


def mad(values: Sequence[float]) -> float:
    """The scaled median absolute deviation (0.0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    centre = median(values)
    return MAD_SCALE * median(abs(v - centre) for v in values)


def below(value: float, others: Sequence[float], k: float, least: float) -> bool:
    """Whether ``value`` lies below the median of ``others`` by more than ``least`` and by
    more than ``k`` scaled MADs of them (the spread the others show among themselves)."""
    if not others:
        return False
    gap = median(others) - value
    return gap > least and gap > k * mad(others)


def others_median_bound(values: Iterable[float]) -> float:
    """The largest median the others of any one of ``values`` can have (the list with that
    one value left out): the median of all but the smallest. A value this bound does not
    exceed by ``least`` is below no leave-one-out median by ``least`` (:func:`below`), so
    a job of thousands of ranks or links takes one median per rank only for the few that
    may be slow. ``-inf`` for fewer than two values (a value alone has no others)."""
    ordered = sorted(values)
    return median(ordered[1:]) if len(ordered) > 1 else float("-inf")
