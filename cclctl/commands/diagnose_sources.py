"""Where `cclctl diagnose` reads a job from: dump files and folders, the folder the ranks
dumped into when none is given, or a live job's store."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator

from cclctl import ui
from cclctl.commands.store_access import connect
from cclctl.config import job_dir, jobs_dir, trace_dir_from_env
from cclctl.diagnose_io import jobs, sources
from cclctl.diagnose_io.inputs import Inputs
from cclctl.errors import UsageError
from cclctl.live.snapshot import JobStatuses, fetch

#: Folders with more dump files than this get a progress bar while they load.
PROGRESS_FILES = 64


def read_dumps(paths: list[str], job: str | None) -> Inputs:
    """cclctl's dumps and PyTorch Flight Recorder dumps among the paths, as one job."""
    count = sources.count_files(paths)
    with ui.progress_bar(count, "reading dumps", enabled=count > PROGRESS_FILES) as bar:
        return sources.load(paths, job, progress=lambda done: bar.advance())


def default_folder(job: str | None) -> str:
    """Where the ranks dumped, with no path given: CCLCTL_TRACE_DIR, else the job's folder
    (``--job``) or the newest job's under ``${TMPDIR:-/tmp}/cclctl-<uid>/``; said on stderr."""
    trace_dir = trace_dir_from_env()
    if trace_dir:
        _say(f"reading the dumps in {trace_dir} (CCLCTL_TRACE_DIR)")
        return trace_dir
    if job is not None:
        folder = jobs.named_job(job_dir(job), job)
        _say(f"reading job {job!r} from {folder.path}")
        return folder.path
    folder, count = jobs.newest_job(jobs_dir())
    others = f"the newest of {count} jobs; --job picks another" if count > 1 else "the only job"
    _say(f"reading job {folder.name!r} from {folder.path} ({others})")
    return folder.path


def _say(line: str) -> None:
    print(f"cclctl: {line}", file=sys.stderr)


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Reading a large job's statuses builds millions of objects and no cycles (reference
    counts free them): the cyclic collector, which would walk them all again and again as
    they are made, waits (about half the parse of 10,000 ranks)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def reading(address: str) -> contextlib.AbstractContextManager[Callable[[str], None]]:
    """The spinner a live read shows on a terminal while it lists and judges a job (the
    callable retitles it): :func:`ui.working`, opened on the listing."""
    return ui.working(f"listing the job's statuses in {address}")


def live_statuses(
    address: str,
    job: str | None,
    alike_from: int | None = None,
    say: Callable[[str], None] | None = None,
) -> JobStatuses:
    """A live job's statuses from its store (``alike_from``, ``say``: see :func:`fetch`)."""
    client = connect(address)
    try:
        statuses = fetch(client, job, alike_from=alike_from, say=say)
    finally:
        client.close()
    if not statuses.statuses and not statuses.bad:
        raise UsageError(f"job {statuses.job!r} has published no status to {address} yet")
    return statuses
