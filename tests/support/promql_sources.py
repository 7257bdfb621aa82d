"""Every PromQL expression the project ships to users: docs/metrics.md and the dashboard.

Tests read them from the files, so a query added there is tested without touching a test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "dashboards" / "cclctl-grafana.json"
_FENCE = re.compile(r"^```promql\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+), )?(\w+)\)$")


def doc_queries() -> list[str]:
    """The expressions of the docs' ```promql blocks: one per line, where an indented line
    continues the one before it (a `#` comment is PromQL's own and stays).
    """
    found: list[str] = []
    for block in _FENCE.findall(DOC.read_text()):
        for line in block.splitlines():
            if line[:1].isspace() and found:
                found[-1] += "\n" + line
            elif line.strip():
                found.append(line)
    return found


def dashboard() -> dict:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_queries() -> list[str]:
    """The ``expr`` of every panel target, Grafana variables still in."""
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def dashboard_variables() -> list[tuple[str, str, str]]:
    """(name, series selector, label) of each ``label_values(selector, label)`` variable."""
    found = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = _LABEL_VALUES.match(var["query"]["query"])
        assert match, f"variable {var['name']}: not a label_values() query"
        found.append((var["name"], match.group(1) or "", match.group(2)))
    return found


def grafana(expr: str, values: dict[str, str]) -> str:
    """``expr`` with Grafana's variables (``$job``, ``$__rate_interval``) replaced by
    ``values``; a variable left without a value fails, so none reaches Prometheus.
    """
    out = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)
    assert "$" not in out, out
    return out
