"""What every command runs first: :func:`cclctl.config_check.preflight`, with the parsers of
the structured variables (they live in the layers above config), warnings on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from cclctl.config_check import Parser, Preflight, preflight
from cclctl.errors import UsageError


def _parsers() -> dict[str, Parser]:
    from cclctl.benchmark.selftest import Corruption
    from cclctl.launch import streaming_copies
    from cclctl.runtime.comm import faults, selection

    def copy_threshold(raw: str) -> object:
        return streaming_copies.threshold({streaming_copies.VARIABLE: raw})

    return {
        "CCLCTL_ALGO": selection.parse,
        "CCLCTL_FAULT": faults.parse,
        "CCLCTL_STREAMING_COPY": copy_threshold,
        "CCLCTL_BENCH_CORRUPT": Corruption.parse,
    }


def check_command(
    command: str,
    options: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> Preflight:
    """Check ``command``'s options (by flag: ``{"--timeout": 5.0}``) and the ``CCLCTL_*``
    variables it will use (in ``env``, default this process's); print a warning per unknown
    ``CCLCTL_*`` name."""
    result = preflight(command, options, env=env, parsers=_parsers())
    for warning in result.warnings:
        print(f"cclctl: warning: {warning}", file=sys.stderr)
    return result


def store_to_read(command: str, given: str | None, missing: str = "") -> str:
    """The store ``top`` or ``diagnose hang`` reads: ``--store``, else ``CCLCTL_STORE``;
    neither is a usage error (``missing`` says what to give)."""
    store = check_command(command, {"--store": given}).store
    if store is None:
        raise UsageError(
            missing or "no store to read: give --store HOST:PORT or set CCLCTL_STORE",
            flag="--store",
        )
    return store
