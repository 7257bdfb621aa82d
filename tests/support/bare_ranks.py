"""Bare rank processes around a store of the test's own: no launcher, so when one dies or
stops, nobody stops the rest; each prints JSON lines the test reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from cclctl.store.client import StoreServer


def run_bare(
    worker: str, n: int, job: str, token: str, *, stuck: int | None = None,
    timeout_s: float = 90.0, **env: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """``n`` processes of ``worker`` (ranks 0..n-1 of ``job``, ``env`` added, no other
    ``CCLCTL_`` variable of the test's); the JSON lines they print, in their order. Rank
    ``stuck`` (one a fault stopped) is not waited for but killed once the others ended, as
    is any process still running then."""
    with StoreServer("127.0.0.1", 0, token=token).start() as server:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        common = {"WORLD_SIZE": str(n), "CCLCTL_STORE": server.address, "CCLCTL_JOB": job,
                  "CCLCTL_TOKEN": token}  # fmt: skip
        procs = [
            subprocess.Popen(
                [sys.executable, worker],
                env={**base, **common, "RANK": str(r), **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for r in range(n)
        ]
        lines: list[dict[str, Any]] = []
        try:
            for r, p in enumerate(procs):
                if r != stuck:
                    out, _ = p.communicate(timeout=timeout_s)
                    lines += [json.loads(s) for s in out.splitlines() if s.startswith("{")]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(5)
    return lines
