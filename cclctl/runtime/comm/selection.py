"""Which algorithm runs a collective: chosen by size, overridable with ``CCLCTL_ALGO``.

``CCLCTL_ALGO`` is a comma list: ``ring`` forces ring wherever an op has it;
``all_reduce=rd,broadcast=chain`` forces per op; ``all_reduce>=1M=ring`` sets the size
from which ``ring`` replaces the small-message algorithm.
"""

from __future__ import annotations

import dataclasses

from cclctl.errors import ConfigError

#: op -> (small-message algorithm, large-message algorithm, default threshold in bytes)
ALGORITHMS: dict[str, tuple[str, str, int]] = {
    "all_reduce": ("rd", "ring", 64 << 10),
    "broadcast": ("tree", "chain", 256 << 10),
    "reduce": ("tree", "ring", 64 << 10),
    "all_gather": ("ring", "ring", 0),
    "reduce_scatter": ("ring", "ring", 0),
    "all_to_all": ("pairwise", "pairwise", 0),
}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclasses.dataclass(frozen=True)
class Selection:
    forced: dict[str, str] = dataclasses.field(default_factory=dict)
    thresholds: dict[str, int] = dataclasses.field(default_factory=dict)

    def choose(self, op: str, nbytes: int) -> str:
        forced = self.forced.get(op)
        if forced:
            return forced
        small, large, default = ALGORITHMS[op]
        return large if nbytes >= self.thresholds.get(op, default) else small


def parse_bytes(text: str) -> int:
    """Bytes in ``text``: a number with an optional unit K, M or G (binary; ``KiB`` and ``KB``
    read alike). Raises ValueError."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def parse(spec: str) -> Selection:
    forced: dict[str, str] = {}
    thresholds: dict[str, int] = {}
    for raw in filter(None, (item.strip() for item in spec.split(","))):
        try:
            if "=" not in raw:
                names = {op for op, algos in ALGORITHMS.items() if raw in algos[:2]}
                if not names:
                    raise ValueError(f"no collective has an algorithm called {raw!r}")
                forced.update(dict.fromkeys(names, raw))
                continue
            key, algo = (p.strip() for p in raw.rsplit("=", 1))
            op, _, size = key.partition(">=")
            op = op.strip()
            if op not in ALGORITHMS:
                raise ValueError(f"unknown collective {op!r}")
            if algo not in ALGORITHMS[op][:2]:
                raise ValueError(
                    f"{op} has no algorithm {algo!r} (has {ALGORITHMS[op][0]}, {ALGORITHMS[op][1]})"
                )
            if size:
                if algo != ALGORITHMS[op][1]:
                    raise ValueError(f"a size threshold selects {ALGORITHMS[op][1]!r} for {op}")
                thresholds[op] = parse_bytes(size)
            else:
                forced[op] = algo
        except ValueError as exc:
            raise ConfigError(f"CCLCTL_ALGO item {raw!r}: {exc}", variable="CCLCTL_ALGO") from None
    return Selection(forced, thresholds)
