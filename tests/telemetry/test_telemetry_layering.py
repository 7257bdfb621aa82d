"""Telemetry stays below the runtime and keeps prometheus_client to the exporter."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHECK = """
import sys
import cclctl.telemetry.hub, cclctl.telemetry.dumps, cclctl.telemetry.status
loaded = sorted(m for m in sys.modules if m.startswith(("prometheus_client", "cclctl.runtime",
                "typer", "rich", "torch")))
print(",".join(loaded))
"""


@pytest.mark.timeout(30)
def test_hub_imports_neither_runtime_nor_prometheus_client():
    out = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=20, check=True
    )
    assert out.stdout.strip() == ""
