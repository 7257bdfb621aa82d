"""One rank of `cclctl probe`: ``python -m cclctl.probe.worker OPTIONS`` (a bare run's
spawned ranks), or :func:`probe_here` (each rank of a launched job).

The rank joins the job, takes part in the schedule (:mod:`~cclctl.probe.in_job`) and closes;
a spawned rank 0 prints the run as one JSON line (``{"event": "probe", "run": {...}}``) for
the parent. A finished probe exits 0 whatever it found: the parent owns the verdict.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import cclctl
from cclctl.errors import EXIT_ERROR, CclError, UsageError
from cclctl.probe import in_job
from cclctl.probe.in_job import ProbeResult
from cclctl.probe.model import ProbeRun
from cclctl.probe.options import ProbeOptions
from cclctl.probe.verdict import Bounds

EVENT = "probe"


def probe_here(opts: ProbeOptions, bounds: Bounds | None = None) -> ProbeResult | None:
    """Join the job from the environment and take part; rank 0 returns the result, which
    it has published to the job's store and its metrics (:mod:`~cclctl.probe.in_job`).

    Retry is off for this communicator: it calls no collective, so its close has nothing to
    serve, and a close that waited for every rank would wait out the retry budget on a
    partner the probe found dead."""
    comm = cclctl.init(retry_budget_s=0)
    try:
        if comm.world_size < 2:
            raise UsageError("cclctl probe needs at least 2 ranks (bare: -g 2 or more)")
        return in_job.probe(comm, opts, bounds)
    finally:
        comm.close()


def run_line(run: ProbeRun) -> str:
    return json.dumps({"event": EVENT, "run": run.to_dict()}, separators=(",", ":"))


def parse_line(line: str) -> ProbeRun | None:
    """The run in one of rank 0's lines; None for any other line."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("event") != EVENT:
        return None
    return ProbeRun.from_dict(message.get("run"))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(args) != 1:
            raise UsageError("usage: python -m cclctl.probe.worker OPTIONS_JSON")
        result = probe_here(ProbeOptions.from_json(args[0]))
        if result is not None:
            sys.stdout.write(run_line(result.run) + "\n")
            sys.stdout.flush()
    except CclError as exc:
        print(f"cclctl probe: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"cclctl probe: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
