"""Who meets whom: round-robin rounds in which every participant is busy with one partner.

The circle method: participant 0 stays put, the others turn around a circle, and round ``r``
pairs position ``i`` with position ``n - 1 - i``. ``n - 1`` rounds meet every pair exactly
once; with ``n`` odd a phantom joins and whoever meets it sits the round out (a bye). A ring
needs only its neighbours: 2 rounds (3 for an odd ring). A sample is a few rounds of the
circle over a random relabelling, so each participant meets a few random partners: enough to
tell a host slow with every partner from a link slow with one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from cclctl.errors import ConfigError

PAIRS = ("all", "ring", "sample")
#: Rounds of ``--pairs sample`` unless ``--rounds`` says otherwise.
DEFAULT_SAMPLE_ROUNDS = 3

Round = list[tuple[int, int]]  # pairs (lower, higher) of participants' ranks


def circle(members: Sequence[int]) -> list[Round]:
    """Every pair of ``members`` once, in ``len - 1`` rounds (``len`` for an odd count)."""
    ids: list[int | None] = list(members)
    if len(ids) < 2:
        return []
    if len(ids) % 2:
        ids.append(None)  # the bye
    n = len(ids)
    rounds: list[Round] = []
    for r in range(n - 1):
        order = [ids[0], *_rotated(ids[1:], r)]
        pairs = []
        for i in range(n // 2):
            a, b = order[i], order[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
    return rounds


def _rotated(items: list[int | None], r: int) -> list[int | None]:
    k = r % len(items)
    return items[len(items) - k :] + items[: len(items) - k]


def ring(members: Sequence[int]) -> list[Round]:
    """Each member with the next (the last with the first): 2 rounds, 3 for an odd ring."""
    n = len(members)
    if n < 2:
        return []
    if n == 2:
        return [[(min(members), max(members))]]
    edges = [(members[i], members[(i + 1) % n]) for i in range(n)]
    colours = [edges[0::2], edges[1::2]]
    if n % 2:  # the closing edge would meet its round's first edge's member twice
        colours = [edges[0 : n - 1 : 2], edges[1 : n - 1 : 2], [edges[n - 1]]]
    return [sorted((min(a, b), max(a, b)) for a, b in c) for c in colours if c]


def sample(members: Sequence[int], rounds: int, seed: int) -> list[Round]:
    """``rounds`` rounds of the circle over a shuffled order (no pair meets twice)."""
    order = list(members)
    random.Random(seed).shuffle(order)
    return circle(order)[:rounds]


def build(
    members: Sequence[int], pairs: str, rounds: int | None = None, seed: int = 0
) -> list[Round]:
    """The schedule of ``pairs`` (``all``, ``ring`` or ``sample``) over ``members``."""
    if pairs == "all":
        return circle(members)
    if pairs == "ring":
        return ring(members)
    if pairs == "sample":
        return sample(members, DEFAULT_SAMPLE_ROUNDS if rounds is None else rounds, seed)
    raise ConfigError(f"--pairs {pairs!r}: choose from {', '.join(PAIRS)}", flag="--pairs")


def partner(round_: Round, member: int) -> int | None:
    """``member``'s partner in ``round_``; None: it sits the round out."""
    for a, b in round_:
        if a == member:
            return b
        if b == member:
            return a
    return None
