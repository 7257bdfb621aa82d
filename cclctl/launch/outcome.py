"""How a launch ended: each rank's exit, who the launcher waits on, and the job's outcome."""

from __future__ import annotations

import dataclasses
import signal

from cclctl.launch.witness import StoreSeen


@dataclasses.dataclass
class RankExit:
    """How one rank ended. ``returncode`` is as Popen reports it: ``-N`` = killed by signal N."""

    rank: int
    returncode: int
    signal_name: str | None
    pid: int = 0
    stopped: bool = False  # it ended after the launcher began stopping the ranks

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def own_signal(self) -> bool:
        """Killed by a signal the launcher did not send (SIGKILL from the OOM killer, ...)."""
        return self.signal_name is not None and not self.stopped

    def __str__(self) -> str:
        if self.signal_name is not None:
            return f"rank {self.rank} was killed by {self.signal_name}"
        if self.returncode:
            return f"rank {self.rank} failed with exit code {self.returncode}"
        return f"rank {self.rank} succeeded"


@dataclasses.dataclass(frozen=True)
class Waiting:
    """The ranks still running (rank -> pid) after the ``finished`` ones exited 0, and for
    how long the launcher has waited on them."""

    running: dict[int, int]
    finished: tuple[int, ...]
    for_s: float


@dataclasses.dataclass
class LaunchResult:
    """The job's outcome: ``returncode`` is 0, the first failed rank's code (1 for a signal),
    128 + N after the launcher got signal N (130 for Ctrl-C), or 1 when ``timeout_s`` ran out."""

    returncode: int
    first_failure: RankExit | None
    exits: list[RankExit]  # by rank
    timed_out: bool = False
    timeout_s: float | None = None
    interrupted: bool = False
    others_stopped: bool = False  # ranks still running were stopped by the launcher
    job: str = ""
    store_address: str = ""
    order: list[int] = dataclasses.field(default_factory=list)  # ranks in the order they ended
    launcher_revoked: bool = False  # the launcher wrote the job's revoke record
    store: StoreSeen | None = None  # what the store held once every rank had ended

    def describe(self) -> str:
        """One line for people: what went wrong, and that the other ranks were stopped."""
        if self.interrupted:
            return "interrupted; all ranks stopped"
        if self.first_failure is not None:
            return f"{self.first_failure}" + (" (others stopped)" if self.others_stopped else "")
        if self.timed_out:
            return f"the job did not finish within {self.timeout_s:g}s; all ranks stopped"
        return f"all {len(self.exits)} ranks succeeded"


def signal_name(returncode: int) -> str | None:
    """The name of the signal that killed a process (Popen's ``-N``), None if none did."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
