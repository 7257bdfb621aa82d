"""One spawned rank of a bare `cclctl bench`: ``python -m cclctl.benchmark.worker OPTIONS``.

``OPTIONS`` is :meth:`BenchOptions.to_json`. The rank joins the job from the launcher's
environment, runs the sweep, and rank 0 streams JSON lines (see events.py) on stdout for
the parent's progress bar and table. A completed sweep exits 0 even with wrong results:
the parent owns the verdict, so the launcher never mistakes a failed check for a crash.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import cclctl
from cclctl.benchmark import events
from cclctl.benchmark.collectives import Communicator
from cclctl.benchmark.options import BenchOptions
from cclctl.benchmark.results import Row, RunMeta, now_iso
from cclctl.benchmark.selftest import Corruption
from cclctl.benchmark.sweep import Sweep, gather_meta, total_rows
from cclctl.config import bench_corrupt_from_env
from cclctl.errors import EXIT_ERROR, CclError, UsageError


class RankSweep:
    """This process as one rank of the job: join, describe the run, sweep, close.

    Shared by the spawned ranks (here) and by `cclctl bench` inside a launched job.
    ``init_flags`` override runtime settings (``metrics_port=...``), as cclctl.init takes them;
    torch's ``cclctl`` backend reads its settings from ``CCLCTL_*``, so for ``torch-cclctl``
    they (and ``--stage``) are set in this process's environment before it joins.
    """

    def __init__(self, opts: BenchOptions, **init_flags: Any) -> None:
        self.opts = opts
        self._flags = init_flags
        self._comm: Communicator | None = None
        self._meta: RunMeta | None = None
        self._corrupt: Corruption | None = None

    def __enter__(self) -> RankSweep:
        corrupt = Corruption.parse(bench_corrupt_from_env())
        comm: Communicator
        timeout_s = self.opts.timeout_s  # -T: None leaves the runtime's own (CCLCTL_TIMEOUT)
        if self.opts.backend == "cclctl":
            timeout = {} if timeout_s is None else {"timeout_s": timeout_s}
            comm = cclctl.init(**timeout, stage=self.opts.stage, **self._flags)
        else:  # torch.distributed, through the same Communicator interface
            from cclctl.benchmark.torch_backend import connect

            flags = self._flags
            if self.opts.backend == "torch-cclctl":
                os.environ["CCLCTL_STAGE"] = self.opts.stage
                if "metrics_port" in flags:
                    os.environ["CCLCTL_METRICS_PORT"] = str(flags["metrics_port"])
                flags = {}
            comm = connect(self.opts.backend, timeout_s=timeout_s, **flags)
        try:
            self.opts.check_world(comm.world_size)
            self._meta = gather_meta(comm, self.opts)
        except BaseException:
            comm.close()
            raise
        self._comm, self._corrupt = comm, corrupt
        return self

    def __exit__(self, *exc: object) -> None:
        if self._comm is not None:
            self._comm.close()

    @property
    def comm(self) -> Communicator:
        if self._comm is None:
            raise RuntimeError("RankSweep is used outside its with-block")
        return self._comm

    @property
    def meta(self) -> RunMeta:
        """Who takes part and with which options (gathered when the job was joined)."""
        if self._meta is None:
            raise RuntimeError("RankSweep is used outside its with-block")
        return self._meta

    @property
    def total(self) -> int:
        return total_rows(self.opts, self.comm.world_size)

    def rows(self) -> Iterator[Row]:
        return Sweep(self.comm, self.opts, self._corrupt).rows()


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(args) != 1:
            raise UsageError("usage: python -m cclctl.benchmark.worker OPTIONS_JSON")
        with RankSweep(BenchOptions.from_json(args[0])) as job:
            rank0 = job.comm.rank == 0
            if rank0:
                for line in events.meta_lines(job.meta):
                    _emit(line)
            for row in job.rows():
                if rank0:
                    _emit(events.row_line(row))
            if rank0:
                _emit(events.end_line(now_iso()))
    except CclError as exc:
        print(f"cclctl bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"cclctl bench: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
