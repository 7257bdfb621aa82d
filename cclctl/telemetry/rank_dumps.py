"""A rank's dumps: where they go, one written at a time, the triggers that write them, and
an earlier run's documents removed as a job starts.

:class:`~.hub.Telemetry` holds one (:attr:`~.hub.Telemetry.rank_dumps`) and offers its
methods, bound once, as its own. Every dump goes to one folder, :attr:`RankDumps.dump_dir`
(see :mod:`.hub`). How a file is written is :mod:`.dump_files`; when a trigger fires,
:mod:`.dumps`.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from cclctl.config import RuntimeConfig, job_dir
from cclctl.records import RankSnapshot
from cclctl.telemetry import dump_files, dumps


class RankDumps:
    """The dumps of one rank. ``snapshot`` takes a document (``snapshot("dump", reason)``);
    ``failures`` and ``recovered`` decide whether an exit deserves a dump (the recorder's,
    see :class:`~.dumps.Dumpable`): the triggers dump through this object.
    """

    def __init__(
        self,
        cfg: RuntimeConfig,
        rank: int,
        world_size: int,
        snapshot: Callable[[str, str], RankSnapshot],
        failures: Callable[[], int],
        recovered: Callable[[], int],
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        #: where dumps and the final document go (``cfg.trace_dir``, else the job's folder)
        self.dump_dir = cfg.trace_dir or job_dir(cfg.job)
        self._snapshot = snapshot
        self.failures = failures
        self.recovered = recovered
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._ended = False  # an ending dump was written (uncaught, terminated, exit)

    def dump_path(self, path: str | None = None) -> str:
        """Where :meth:`dump` writes: ``path`` if it names a ``.json`` file, else the standard
        file name (``cclctl-<job>-rank<r>.json``) inside ``path`` or :attr:`dump_dir`.
        """
        target = path or self.dump_dir
        if target.endswith(".json") and not os.path.isdir(target):
            return target
        return os.path.join(target, dump_files.dump_filename(self.cfg.job, self.rank))

    def dump(self, reason: str, path: str | None = None) -> str:
        """Write the flight recorder as one JSON document (atomically); returns the path.

        Raises :class:`~cclctl.errors.CclError` if the file cannot be written.
        """
        target = self.dump_path(path)
        ending = dumps.ends_process(reason)
        with self._lock:  # one at a time, each snapshot taken as its turn comes
            if self._ended and not ending:
                return target  # the process's last word stands (it holds more than this)
            dump_files.write_atomic(target, self._snapshot("dump", reason).to_json())
            self._ended = self._ended or ending
        return target

    def remove_stale_dumps(self) -> list[str]:
        """At a job's start: remove an earlier run's documents from :attr:`dump_dir` (this
        rank's own; rank 0 also those of ranks beyond this world size). Returns them."""
        return dump_files.remove_stale(self.dump_dir, self.cfg.job, self.rank, self.world_size)

    def install_signal_dump(
        self, directory: str | None = None, signum: int = signal.SIGUSR1
    ) -> None:
        """Dump on SIGUSR1 (or ``signum``) into ``directory`` or :attr:`dump_dir`. Main
        thread only; a previous handler keeps being called.
        """
        self._hooks.append(dumps.install_signal_dump(self, directory, signum))

    def install_termination_dump(self, directory: str | None = None) -> None:
        """Dump on SIGTERM (as a launcher stops ranks), then terminate. Main thread only."""
        self._hooks.append(dumps.install_termination_dump(self, directory))

    def install_exit_dump(self, directory: str | None = None) -> None:
        """Dump if the process dies of an uncaught exception or exits after errors/hangs.

        The hooks outlive :meth:`~.hub.Telemetry.close` on purpose: a ``finally`` that
        closes telemetry runs before the exception reaches ``sys.excepthook``. An uncaught
        cclctl error prints as its one line unless ``cfg.debug`` (``CCLCTL_DEBUG=1``) asks
        for the traceback.
        """
        self._hooks.append(dumps.install_exit_dump(self, directory, not self.cfg.debug))

    def remove_hooks(self) -> None:
        """Undo :meth:`install_signal_dump`, :meth:`install_termination_dump` and
        :meth:`install_exit_dump`."""
        hooks, self._hooks = self._hooks, []
        for undo in reversed(hooks):
            undo()
