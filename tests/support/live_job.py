"""A real job launched in a thread for the live tests: each rank prints one JSON line when
it is ready and holds until the test touches ``release``; the job's result is checked."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cclctl.launch.launcher import LaunchResult, launch


class LiveJob:
    """What the ranks said: their ready documents (``ready``) and every line (``lines``)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.ready: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.results: list[LaunchResult] = []
        self.all_ready = threading.Event()

    def output(self, rank: int, stream: str, line: str) -> None:
        self.lines.append(f"[{rank}] {line}")
        if stream == "stdout" and line.startswith("{"):
            self.ready.append(json.loads(line))
            if len(self.ready) == self.ranks:
                self.all_ready.set()

    @property
    def store(self) -> str:
        return str(self.ready[0]["store"])

    def tail(self) -> str:
        return "\n".join(self.lines[-20:])


@contextmanager
def live_job(
    cmd: Sequence[str], ranks: int, env: dict[str, str], release: Path
) -> Iterator[LiveJob]:
    """Run ``cmd`` as ``ranks`` ranks; yield once every rank is ready; on the way out,
    release them, wait for the job and require it to have succeeded."""
    job = LiveJob(ranks)
    thread = threading.Thread(
        target=lambda: job.results.append(
            launch(list(cmd), ranks, env=env, output=job.output, timeout_s=90)
        )
    )
    thread.start()
    try:
        assert job.all_ready.wait(60), job.tail()
        yield job
    finally:
        release.touch()
        thread.join(60)
    assert job.results and job.results[0].returncode == 0, job.tail()
