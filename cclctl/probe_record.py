"""A probe's result as the rest of cclctl reads it: where rank 0 publishes it in the job's
store, and a checked, bounded reading of the ``cclctl.probe`` document.

Rank 0 of a probe that runs inside a job (``cclctl probe`` under ``cclctl launch``, srun or
torchrun, or :func:`cclctl.probe.in_job.probe` from a training script) writes the document,
compact JSON, under ``cclctl/<job>/probe`` (:data:`KEY`), each probe replacing the last, and
hands the same record to its telemetry, whose exporter publishes the links as metrics.
``cclctl top`` reads it in the same listing as the statuses (one line about the last probe)
and ``cclctl diagnose slow --store`` joins its flagged links to its own findings.

A published document holds at most :data:`MAX_LINKS` links, those that did not pass first
(:func:`bounded`), and says how many the probe had (``links_total``); a reader refuses more
links or findings than the bounds, and a document larger than :data:`MAX_BYTES`, before it
builds anything. Standard library only: every layer may read a probe.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from cclctl import limits
from cclctl.errors import BadInput

#: The key under the job's scope (``cclctl/<job>/probe``).
KEY = "probe"
SCHEMA = "cclctl.probe"
VERSION = 1
#: Links a published document holds (a 64-rank job's full matrix is 4,032).
MAX_LINKS = 4096
#: Findings a published document holds; more are cut, the count kept.
MAX_FINDINGS = 256
#: The largest document a reader parses.
MAX_BYTES = 4 << 20
_WHERE = "probe"


@dataclasses.dataclass(frozen=True)
class ProbeLink:
    """The directed link ``src`` -> ``dst`` as the probe judged it. ``status``: ``ok``
    (measured), ``unreachable`` or ``skipped``; ``flagged``: measured below its bounds."""

    src: int
    dst: int
    kind: str
    status: str
    bandwidth: float | None
    latency: float | None
    flagged: bool

    @property
    def passed(self) -> bool:
        return self.status == "ok" and not self.flagged


@dataclasses.dataclass(frozen=True)
class ProbeFinding:
    """One finding: ``slow_link`` (``src``, ``dst``), ``slow_host`` (``host``,
    ``direction``: egress or ingress) or ``unreachable`` (the pair ``src``, ``dst``)."""

    kind: str
    text: str
    src: int | None = None
    dst: int | None = None
    host: str | None = None
    direction: str | None = None


@dataclasses.dataclass(frozen=True)
class ProbeRecord:
    """The last probe: when it ended (wall clock, ns; 0 when the document does not say),
    the job's hosts by rank, its links and findings, and the median bandwidth of each kind."""

    time_ns: int
    world_size: int
    hosts: tuple[str, ...]
    transport: str
    links: tuple[ProbeLink, ...]
    findings: tuple[ProbeFinding, ...]
    links_total: int
    medians: Mapping[str, float]

    @property
    def ok(self) -> bool:
        return not self.findings

    def host(self, rank: int) -> str:
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else "?"

    def link(self, src: int, dst: int) -> ProbeLink | None:
        for link in self.links:
            if link.src == src and link.dst == dst:
                return link
        return None


def bounded(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` (a whole ``cclctl.probe`` document) as it is published: at most
    :data:`MAX_LINKS` links, those that did not pass first, and :data:`MAX_FINDINGS`
    findings; ``links_total`` and ``findings_total`` say how many there were."""
    out = dict(doc)
    links = list(doc.get("links", ()))
    if len(links) > MAX_LINKS:
        links.sort(key=lambda x: x.get("status") == "ok" and not x.get("flagged"))
        links = sorted(links[:MAX_LINKS], key=lambda x: (x.get("src", 0), x.get("dst", 0)))
    out["links"] = links
    out["links_total"] = int(doc.get("links_total", len(doc.get("links", ()))))
    findings = list(doc.get("findings", ()))
    out["findings"] = findings[:MAX_FINDINGS]
    out["findings_total"] = int(doc.get("findings_total", len(findings)))
    return out


def parse(raw: bytes | str, where: str = _WHERE) -> ProbeRecord:
    """The record in a published document; BadInput on anything a reader cannot use."""
    if len(raw) > MAX_BYTES:
        raise BadInput(f"{where}: {len(raw):,} bytes, over the {MAX_BYTES:,} a probe may have",
                       where=where)  # fmt: skip
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadInput(f"{where}: not valid JSON ({exc})", where=where) from None
    return from_dict(data, where)


def from_dict(data: object, where: str = _WHERE) -> ProbeRecord:
    """The record in a parsed ``cclctl.probe`` document (see :func:`parse`)."""
    d = _mapping(data, where, "the document")
    if d.get("schema") != SCHEMA:
        raise BadInput(f"{where}: not a {SCHEMA} document", where=where)
    version = d.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
        raise BadInput(f"{where}: {SCHEMA} version {version!r} is newer than this cclctl "
                       f"reads ({VERSION})", where=where)  # fmt: skip
    world = limits.world_size(_int(d.get("world_size"), where, "world_size"), where)
    hosts = d.get("hosts", [])
    if not isinstance(hosts, list) or len(hosts) > world:
        raise BadInput(f"{where}: 'hosts' is not a list of the ranks' hosts", where=where)
    raw_links = d.get("links")
    raw_findings = d.get("findings", [])
    if not isinstance(raw_links, list) or not isinstance(raw_findings, list):
        raise BadInput(f"{where}: 'links' and 'findings' must be lists", where=where)
    if len(raw_links) > MAX_LINKS or len(raw_findings) > MAX_FINDINGS:
        raise limits.TooLarge(
            f"{where}: {len(raw_links):,} links and {len(raw_findings):,} findings, over the "
            f"{MAX_LINKS:,} and {MAX_FINDINGS:,} a published probe may hold", where=where
        )  # fmt: skip
    links = tuple(_link(x, world, where) for x in raw_links)
    kinds = d.get("kinds", {})
    medians = {
        str(kind): float(s["median"])
        for kind, s in (kinds.items() if isinstance(kinds, Mapping) else ())
        if isinstance(s, Mapping) and _number(s.get("median"))
    }
    return ProbeRecord(
        time_ns=max(0, _int(d.get("time_ns", 0), where, "time_ns")),
        world_size=world,
        hosts=tuple(str(h) for h in hosts),
        transport=str(d.get("transport", "")),
        links=links,
        findings=tuple(_finding(x, world, where) for x in raw_findings),
        links_total=max(len(links), _int(d.get("links_total", len(links)), where, "links_total")),
        medians=medians,
    )


def _link(data: object, world: int, where: str) -> ProbeLink:
    d = _mapping(data, where, "a link")
    return ProbeLink(
        src=_rank(d.get("src"), world, where),
        dst=_rank(d.get("dst"), world, where),
        kind=str(d.get("kind", "")),
        status=str(d.get("status", "ok")),
        bandwidth=_float_or_none(d.get("bandwidth")),
        latency=_float_or_none(d.get("latency")),
        flagged=d.get("flagged") is True,
    )


def _finding(data: object, world: int, where: str) -> ProbeFinding:
    d = _mapping(data, where, "a finding")
    src, dst = d.get("src"), d.get("dst")
    host, direction = d.get("host"), d.get("direction")
    return ProbeFinding(
        kind=str(d.get("kind", "")),
        text=str(d.get("text", ""))[:1000],
        src=None if src is None else _rank(src, world, where),
        dst=None if dst is None else _rank(dst, world, where),
        host=None if host is None else str(host),
        direction=None if direction is None else str(direction),
    )


def _mapping(data: object, where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise BadInput(f"{where}: {what} is not an object", where=where)
    return data


def _number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and _number(value) else None


def _int(value: object, where: str, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > limits.MAX_INT:
        raise BadInput(f"{where}: {what} {value!r} is not an integer", where=where)
    return value


def _rank(value: object, world: int, where: str) -> int:
    rank = limits.rank(_int(value, where, "a rank"), where)
    if rank >= world:
        raise BadInput(f"{where}: rank {rank} is beyond the world size {world}", where=where)
    return rank
