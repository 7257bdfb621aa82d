"""A self-test of the checker: ``CCLCTL_BENCH_CORRUPT`` flips bits in a checked result.

Users (and our tests) can prove that ``#wrong`` really compares every element: with
``CCLCTL_BENCH_CORRUPT=1`` rank 1 corrupts one element of every result it checks, so the
table must show wrong elements and ``cclctl bench`` must exit 4. The value is
``RANK[:OP[:SIZE]]``: the rank, optionally only one op (``all_gather``) and one row size in
bytes as the table shows it. It never touches the timed iterations.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cclctl.benchmark.catalog import normalize_op
from cclctl.errors import ConfigError

_VARIABLE = "CCLCTL_BENCH_CORRUPT"


@dataclasses.dataclass(frozen=True)
class Corruption:
    rank: int
    op: str | None = None
    size: int | None = None

    @classmethod
    def parse(cls, text: str) -> Corruption | None:
        """Parse the variable's value; empty means no corruption."""
        text = text.strip()
        if not text:
            return None
        parts = text.split(":")
        try:
            if len(parts) > 3:
                raise ValueError("too many fields")
            rank = int(parts[0])
            op = normalize_op(parts[1]) if len(parts) > 1 and parts[1] else None
            size = int(parts[2]) if len(parts) > 2 and parts[2] else None
        except (ValueError, ConfigError) as exc:
            raise ConfigError(
                f"{_VARIABLE}={text!r} must be RANK[:OP[:SIZE]] ({exc})", variable=_VARIABLE
            ) from None
        return cls(rank, op, size)

    def applies(self, rank: int, op: str, size: int) -> bool:
        return (
            rank == self.rank
            and (self.op is None or self.op == op)
            and (self.size is None or self.size == size)
        )

    @staticmethod
    def apply(result: np.ndarray) -> None:
        """Invert every bit of the result's first byte: always a different element value."""
        if result.size:
            result.view(np.uint8)[0] ^= 0xFF
