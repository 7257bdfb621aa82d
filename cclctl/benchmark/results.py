"""The benchmark's results: one Row per (op, size), one RunMeta per run, as plain JSON.

Rows travel from rank 0 to the parent as JSON lines and end up in the JSON report, so the
field names are the table's (``size``, ``count``, ``type``, ``redop``, ``root``, and per
placement ``time`` in microseconds, ``algbw``, ``busbw`` in GB/s and ``#wrong``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from cclctl.errors import BadInput

BENCH_SCHEMA = "cclctl.bench"
BENCH_SCHEMA_VERSION = 1


def _mapping(data: object) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    return data


def now_iso() -> str:
    """Now, as a run's metadata stamps it (UTC, seconds)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


#: The relay's stages as a staged row reports them, in pipeline order.
RELAY_STAGES = ("d2h", "collective", "h2d")


@dataclasses.dataclass(frozen=True)
class RelayTiming:
    """A staged placement's stages (``--stage always``): the microseconds each stage took
    per call (summed over the call's chunks) and ``relay_efficiency``, busbw over the
    slowest stage's bandwidth (1.0: every other stage hidden behind the slowest)."""

    d2h_us: float
    collective_us: float
    h2d_us: float
    efficiency: float

    def stages_us(self) -> dict[str, float]:
        return {"d2h": self.d2h_us, "collective": self.collective_us, "h2d": self.h2d_us}

    @classmethod
    def from_dict(cls, stages: Mapping[str, Any], efficiency: Any) -> RelayTiming:
        d2h, collective, h2d = (float(stages[name]) for name in RELAY_STAGES)
        return cls(d2h, collective, h2d, float(efficiency))


@dataclasses.dataclass(frozen=True)
class Timing:
    """One placement (out-of-place or in-place) of one row.

    ``wrong`` is the number of wrong elements summed over ranks, or None when the result
    was not checked (``--check 0``, or in-place sendrecv, which nccl-tests does not check).
    ``relay`` is the placement's stages when its calls went through the relay, else None
    (and then the placement's JSON has no stage keys).
    """

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None
    relay: RelayTiming | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "time": self.time_us,
            "algbw": self.algbw,
            "busbw": self.busbw,
            "#wrong": self.wrong,
        }
        if self.relay is not None:
            data["stages"] = self.relay.stages_us()
            data["relay_efficiency"] = self.relay.efficiency
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        wrong = data["#wrong"]
        relay = None
        if "stages" in data:
            relay = RelayTiming.from_dict(_mapping(data["stages"]), data["relay_efficiency"])
        return cls(
            float(data["time"]),
            float(data["algbw"]),
            float(data["busbw"]),
            None if wrong is None else int(wrong),
            relay,
        )


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: an op at one size, out-of-place and in-place."""

    op: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Timing
    in_place: Timing

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "size": self.size,
            "count": self.count,
            "type": self.type,
            "redop": self.redop,
            "root": self.root,
            "out_of_place": self.out_of_place.to_dict(),
            "in_place": self.in_place.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: object) -> Row:
        """Parse a row written by :meth:`to_dict`; raises BadInput on anything else."""
        try:
            data = _mapping(data)
            return cls(
                str(data["op"]),
                int(data["size"]),
                int(data["count"]),
                str(data["type"]),
                str(data["redop"]),
                int(data["root"]),
                Timing.from_dict(data["out_of_place"]),
                Timing.from_dict(data["in_place"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"bench row is malformed: {exc!r}", where="bench row") from None

    @property
    def timings(self) -> tuple[Timing, Timing]:
        return (self.out_of_place, self.in_place)


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where one rank ran (the table's "Using ranks" lines)."""

    rank: int
    host: str
    pid: int

    @classmethod
    def from_dict(cls, data: object) -> RankInfo:
        try:
            data = _mapping(data)
            return cls(int(data["rank"]), str(data["host"]), int(data["pid"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"bench rank info is malformed: {exc!r}", where="bench rank") from None


@dataclasses.dataclass(frozen=True)
class RunMeta:
    """What a report needs besides the rows: who ran, on what, with which options."""

    world_size: int
    ranks: tuple[RankInfo, ...]
    backend: str
    version: str
    options: Mapping[str, Any]  # BenchOptions.to_dict(): ops, dtype, sizes, iters, command...
    started_at: str  # ISO 8601, UTC
    finished_at: str = ""

    @property
    def hosts(self) -> list[str]:
        """Distinct hosts in rank order."""
        return list(dict.fromkeys(info.host for info in self.ranks))

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "hosts": self.hosts,
            "ranks": [dataclasses.asdict(info) for info in self.ranks],
            "backend": self.backend,
            "version": self.version,
            **dict(self.options),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_dict(cls, data: object, option_keys: Sequence[str]) -> RunMeta:
        """Parse :meth:`to_dict` output; ``option_keys`` says which keys are options."""
        try:
            data = _mapping(data)
            ranks = tuple(RankInfo.from_dict(info) for info in data["ranks"])
            return cls(
                int(data["world_size"]),
                ranks,
                str(data["backend"]),
                str(data["version"]),
                {key: data[key] for key in option_keys if key in data},
                str(data["started_at"]),
                str(data.get("finished_at", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"bench metadata is malformed: {exc!r}", where="bench meta") from None

    def finished(self, when: str) -> RunMeta:
        return dataclasses.replace(self, finished_at=when)
