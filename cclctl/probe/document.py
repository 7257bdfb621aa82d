"""The ``cclctl.probe`` JSON document (``-J/--json``), and a baseline read back from one.

Version 1: ``schema``, ``version``, the run (world size, each rank's host, participants,
transport, pairs, direction, rounds, each round's seconds, options), ``links`` (each with
``src``, ``dst``, ``kind``, ``status``, ``bandwidth`` in bytes/s, ``latency`` in seconds,
``flagged``), ``kinds`` (median, MAD and relative bound of each kind) and ``findings``
(``kind``: ``slow_link``, ``slow_host`` or ``unreachable``, and ``text``). Fields are only
ever added; readers ignore unknown ones.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from cclctl.errors import BadInput
from cclctl.probe.model import ProbeRun
from cclctl.probe.verdict import Verdict

SCHEMA = "cclctl.probe"
VERSION = 1


def build(run: ProbeRun, verdict: Verdict) -> dict[str, Any]:
    data = run.to_dict()
    links = data.pop("links")
    for link in links:
        link["flagged"] = (link["src"], link["dst"]) in verdict.flagged
    return {
        "schema": SCHEMA,
        "version": VERSION,
        **data,
        "ok": verdict.ok,
        "links": links,
        "kinds": {kind: s.to_dict() for kind, s in verdict.stats.items()},
        "findings": [f.to_dict() for f in verdict.findings],
    }


def dumps(run: ProbeRun, verdict: Verdict) -> str:
    return json.dumps(build(run, verdict), indent=1) + "\n"


def baseline(text: str, where: str) -> dict[str, float]:
    """The median bandwidth of each kind's measured, unflagged links in an earlier
    document (``text``, read from ``where``): what ``--baseline`` compares against."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{where} is not JSON: {exc}", where=where) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BadInput(f"{where} is not a cclctl.probe document (from cclctl probe -J)",
                       where=where)  # fmt: skip
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise BadInput(f"{where}: cclctl.probe version {data.get('version')!r} is newer than "
                       f"this cclctl reads ({VERSION})", where=where)  # fmt: skip
    links = data.get("links")
    if not isinstance(links, list):
        raise BadInput(f"{where} has no links", where=where)
    by_kind: dict[str, list[float]] = {}
    for link in links:
        if not isinstance(link, dict) or link.get("flagged") or link.get("status") != "ok":
            continue
        bw, kind = link.get("bandwidth"), link.get("kind")
        if isinstance(bw, int | float) and not isinstance(bw, bool) and bw > 0 and kind:
            by_kind.setdefault(str(kind), []).append(float(bw))
    if not by_kind:
        raise BadInput(f"{where} holds no measured link to compare with", where=where)
    return {kind: statistics.median(values) for kind, values in by_kind.items()}
