"""What a probe measured: one record per directed link, and the run around them.

Rank 0 builds a :class:`ProbeRun` from every participant's reports; the verdict, the
renderings and the JSON document all read it, and a bare run's parent rebuilds it from the
one JSON line rank 0 prints, so these are plain values with a dict form each way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cclctl.errors import BadInput

#: Link kinds, each judged against links of its own kind only.
SHM, TCP_LOCAL, TCP = "shm", "tcp-local", "tcp"
KIND_WORDS = {SHM: "shared-memory", TCP_LOCAL: "TCP links within a host", TCP: "TCP"}
#: Link states: measured; no transfer completed within the timeout or the link broke; not
#: measured because an end had stopped taking part.
OK, UNREACHABLE, SKIPPED = "ok", "unreachable", "skipped"


@dataclasses.dataclass(frozen=True)
class Link:
    """The directed link ``src`` -> ``dst``: bandwidth (bytes/s) and latency (s), the
    medians of the repeats the sender timed; ``why`` says what failed when not ``ok``."""

    src: int
    dst: int
    kind: str
    status: str = OK
    bandwidth: float | None = None
    latency: float | None = None
    repeats: int = 0
    why: str = ""

    @property
    def measured(self) -> bool:
        return self.status == OK and self.bandwidth is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Link:
        d = _mapping(data, "link")
        try:
            return cls(
                src=int(d["src"]),
                dst=int(d["dst"]),
                kind=str(d["kind"]),
                status=str(d.get("status", OK)),
                bandwidth=_float_or_none(d.get("bandwidth")),
                latency=_float_or_none(d.get("latency")),
                repeats=int(d.get("repeats", 0)),
                why=str(d.get("why", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"a probe link is malformed: {exc}", where="probe") from None


@dataclasses.dataclass(frozen=True)
class ProbeRun:
    """One probe: the job's ranks (``hosts[r]`` is rank r's host), the participants, the
    schedule's round count and each round's time at rank 0, and every directed link."""

    world_size: int
    hosts: tuple[str, ...]
    participants: tuple[int, ...]
    transport: str
    pairs: str
    direction: str
    rounds: int
    round_s: tuple[float, ...]
    links: tuple[Link, ...]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    recheck_s: tuple[float, ...] = ()  # each recheck round's time (slow pairs again)
    time_ns: int = 0  # when the schedule ended at rank 0 (wall clock)

    def host(self, rank: int) -> str:
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else "?"

    def link(self, src: int, dst: int) -> Link | None:
        for link in self.links:
            if link.src == src and link.dst == dst:
                return link
        return None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["options"] = dict(self.options)
        data["links"] = [link.to_dict() for link in self.links]
        return data

    @classmethod
    def from_dict(cls, data: object) -> ProbeRun:
        d = _mapping(data, "probe run")
        try:
            return cls(
                world_size=int(d["world_size"]),
                hosts=tuple(str(h) for h in d["hosts"]),
                participants=tuple(int(r) for r in d["participants"]),
                transport=str(d["transport"]),
                pairs=str(d["pairs"]),
                direction=str(d["direction"]),
                rounds=int(d["rounds"]),
                round_s=tuple(float(s) for s in d["round_s"]),
                links=tuple(Link.from_dict(x) for x in d["links"]),
                options=dict(_mapping(d.get("options", {}), "options")),
                recheck_s=tuple(float(s) for s in d.get("recheck_s", ())),
                time_ns=int(d.get("time_ns", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"a probe run is malformed: {exc}", where="probe") from None


def _mapping(data: object, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise BadInput(f"a {what} is not an object", where="probe")
    return data


def _float_or_none(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def link_kind(same_host: bool, shared_memory: bool) -> str:
    """A link's kind from where its ends are and whether they share memory."""
    if shared_memory:
        return SHM
    return TCP_LOCAL if same_host else TCP
