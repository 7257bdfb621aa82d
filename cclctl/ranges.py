"""Rank lists folded into ranges (``0-5,7``), the way Slurm and SREs write them.

A verdict that lists 997 of 1000 ranks one by one is unreadable; folded, it fits a line.
Standard library only, so every layer (rendezvous errors, diagnosis, the CLI) can use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from cclctl.errors import UsageError

MAX_RANGE = 1 << 20  # no job has more ranks; a bigger range is a typo, not a request


def fold_ranks(ranks: Iterable[int]) -> str:
    """``[7, 0, 1, 2, 2, 3]`` -> ``"0-3,7"``: sorted, duplicates dropped, runs folded."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[start], ordered[end]
        parts.append(str(first) if first == last else f"{first}-{last}")
        start = end + 1
    return ",".join(parts)


def parse_ranks(text: str, limit: int = MAX_RANGE) -> list[int]:
    """``"0-3,7"`` -> ``[0, 1, 2, 3, 7]``, the inverse of :func:`fold_ranks`.

    Every rank is below ``limit`` and the parts name at most ``limit`` ranks in all, checked
    before any is listed, so a short text never expands into a huge list. Raises UsageError
    naming the bad part, since this reads what users type.
    """
    ranks: set[int] = set()
    named = 0
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low_text, sep, high_text = part.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if sep else low
        except ValueError:
            raise UsageError(f"{part!r} in {text!r} is not a rank or a range like 0-3") from None
        if low < 0 or high < low or high - low > MAX_RANGE:
            raise UsageError(f"{part!r} in {text!r} is not a valid rank range")
        named += high - low + 1
        if high >= limit or named > limit:
            raise UsageError(f"{part!r} in {text!r} goes beyond {limit:,} ranks")
        ranks.update(range(low, high + 1))
    return sorted(ranks)
