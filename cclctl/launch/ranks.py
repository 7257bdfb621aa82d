"""Supervise one launch's rank processes: start them, watch them, stop them, reap them.

Each rank runs in its own process group, so stopping a rank stops whatever it started. The
first rank to fail stops the others (SIGTERM, then SIGKILL after a grace period); Ctrl-C is
forwarded to the ranks before they are stopped the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from types import FrameType

from cclctl.errors import EXIT_ERROR, CclError, UsageError
from cclctl.launch import child_guard
from cclctl.launch.outcome import LaunchResult, RankExit, Waiting, signal_name
from cclctl.launch.output import LineSink, OutputPump
from cclctl.launch.pidfds import ExitWaiter
from cclctl.launch.witness import StoreSeen, Witness, death_record

SIGNAL_EXIT_BASE = 128  # the shell's convention: 130 after Ctrl-C, 143 after SIGTERM
OUTPUT_DRAIN_S = 5.0

#: Called once when the job first fails (the failed rank, or None when ``timeout_s`` ran
#: out), with what the store holds then, before the launcher stops the other ranks: the
#: moment a diagnosis still sees the job as it failed.
FailureHook = Callable[[RankExit | None, StoreSeen | None], None]

#: Called every ``wait_interval_s`` while some ranks have exited 0 and the others still run
#: (and the launcher is not stopping the job): who the launcher waits on, and what the
#: store holds then. A job that waits on a stopped or lagging rank says so.
WaitHook = Callable[[Waiting, StoreSeen | None], None]

#: After a rank's failure the others are revoked (the job's revoke record reaches them in
#: milliseconds) and end by themselves, each printing its own error naming the origin:
#: they get this long to do so before the launcher stops them.
REPORT_S = 1.0


def _ended(proc: subprocess.Popen[bytes]) -> int | None:
    """``proc``'s return code as Popen gives it once it ended, without reaping it yet."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere: Popen knows
        return proc.poll()
    if info is None:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return info.si_status


class RankJob:
    """The ranks of one launch, and the escalation that stops them."""

    def __init__(
        self,
        cmd: list[str],
        nprocs: int,
        envs: list[dict[str, str]],
        witness: Witness | None = None,
        on_failure: FailureHook | None = None,
        on_wait: WaitHook | None = None,
        wait_interval_s: float = 1.0,
    ) -> None:
        self.cmd = cmd
        self.envs = envs
        self.witness = witness
        self.on_failure = on_failure
        self.on_wait = on_wait
        self.wait_interval_s = wait_interval_s
        self.waiting_since: float | None = None  # some ranks finished, others still run
        self.waited_after: tuple[int, ...] = ()  # the finished ranks as last seen
        self.next_wait_report = 0.0
        self.launcher_revoked = False
        self.procs: list[subprocess.Popen[bytes]] = []
        self.exits: dict[int, RankExit] = {}
        self.order: list[int] = []
        self.waiter = ExitWaiter()
        self.first_failure: RankExit | None = None
        self.pending: list[tuple[float, signal.Signals]] = []  # (when, signal) still to send
        self.stopping = False  # once set, a rank that ends badly is a casualty, not the cause
        self.others_stopped = False  # some rank was still running when stopping began
        self.signals: list[int] = []  # received by the launcher, handled by the loop
        self.interrupted_by: int | None = None
        self.poll_s = 0.02 if nprocs <= 64 else 0.1

    def run(
        self,
        sink: LineSink,
        grace_s: float,
        timeout_s: float | None,
        on_start: Callable[[str, str], None] | None = None,
    ) -> LaunchResult:
        pump = OutputPump(sink)
        restore = self._catch_signals()
        timed_out = False
        try:
            self._start_all(pump)
            if on_start is not None:
                on_start(self.envs[0]["CCLCTL_STORE"], self.envs[0]["CCLCTL_JOB"])
            pump.start()
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while len(self.exits) < len(self.procs):
                self._reap(grace_s)
                self._handle_signals(grace_s)
                late = deadline is not None and time.monotonic() > deadline
                if not self.stopping and (late or pump.error is not None):
                    timed_out = late  # or output cannot be delivered: stop, then raise below
                    if late:
                        self._witness(None)
                    self._stop(grace_s)
                self._escalate()
                self._report_waiting()
                self.waiter.wait(self.poll_s)
        finally:
            restore()
            self._kill_all()
            self.waiter.close()
            pump.join(OUTPUT_DRAIN_S)
        if pump.error is not None:
            raise pump.error
        return self._result(timed_out, timeout_s)

    def _start_all(self, pump: OutputPump) -> None:
        """Start every rank from this thread, which supervises them until they end (the
        parent-death signal is tied to the thread that forks: see child_guard)."""
        cmd = child_guard.guarded(self.cmd, os.getpid())
        for rank, env in enumerate(self.envs):
            try:
                child_guard.check_runnable(self.cmd[0], env)
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    process_group=0,
                )
            except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
                raise UsageError(f"cannot run {self.cmd[0]!r}: {exc.strerror or exc}") from None
            except OSError as exc:  # out of processes or file descriptors: not the user's typo
                raise CclError(f"cannot start rank {rank}: {exc.strerror or exc}") from None
            self.procs.append(proc)
            self.waiter.watch(rank, proc.pid)
            assert proc.stdout is not None and proc.stderr is not None
            pump.add(proc.stdout, rank, "stdout")
            pump.add(proc.stderr, rank, "stderr")

    def _reap(self, grace_s: float) -> None:
        ended = [
            RankExit(rank, code, signal_name(code), proc.pid, self.stopping)
            for rank, proc in enumerate(self.procs)
            if rank not in self.exits and (code := _ended(proc)) is not None
        ]
        # ranks seen ending together: a death by signal comes before the errors it caused
        for one in sorted(ended, key=lambda e: (not e.own_signal, not e.failed, e.rank)):
            self.exits[one.rank] = one
            self.order.append(one.rank)
            self.waiter.forget(one.rank)
            if one.failed and not self.stopping:
                self.first_failure = one
                self._witness(one)
                self._stop(grace_s, after_s=REPORT_S)
        for one in ended:  # reaped only now: until then its peers read its exit status
            self.procs[one.rank].poll()  # from /proc (a zombie's), and name its signal

    def _witness(self, first: RankExit | None) -> None:
        """Record the first failure in the store (unless a rank already did), then hand
        it to ``on_failure`` with what the store holds, before the others are stopped
        (``first`` None: the job timed out or the launcher was interrupted)."""
        if self.witness is None:
            return
        if first is not None:
            record = death_record(first.rank, first.pid, first.returncode, first.signal_name)
            self.launcher_revoked = self.witness.record(record)
        if self.on_failure is not None:
            self.on_failure(first, self.witness.look())

    def _report_waiting(self) -> None:
        """Call ``on_wait`` once every interval while ranks that exited 0 wait on ranks
        still running, from one interval after the last rank exited: ranks that end
        within an interval of each other say nothing."""
        if self.on_wait is None:
            return
        finished = tuple(sorted(r for r, e in self.exits.items() if not e.failed))
        running = {r: p.pid for r, p in enumerate(self.procs) if r not in self.exits}
        now = time.monotonic()
        if self.stopping or not finished or not running:
            self.waiting_since, self.waited_after = None, ()
            return
        if self.waiting_since is None:
            self.waiting_since = now
        if finished != self.waited_after:  # one more rank exited: wait an interval again
            self.waited_after = finished
            self.next_wait_report = now + self.wait_interval_s
        if now < self.next_wait_report:
            return
        self.next_wait_report = now + self.wait_interval_s
        seen = None if self.witness is None else self.witness.look()
        self.on_wait(Waiting(running, finished, now - self.waiting_since), seen)

    def _stop(self, grace_s: float, after_s: float = 0.0) -> None:
        """SIGTERM the ranks still running in ``after_s``, SIGKILL them ``grace_s`` later."""
        self._begin_stopping()
        at = time.monotonic() + after_s
        self.pending = [(at, signal.SIGTERM), (at + grace_s, signal.SIGKILL)]

    def _begin_stopping(self) -> None:
        self.stopping = True
        self.others_stopped = len(self.exits) < len(self.procs)

    def _handle_signals(self, grace_s: float) -> None:
        """Ctrl-C (or SIGTERM) on the launcher: forward it, then stop; twice: kill now."""
        if not self.signals:
            return
        received, self.signals = self.signals, []
        if self.interrupted_by is None:
            self.interrupted_by = received[0]
        now = time.monotonic()
        if len(received) > 1 or self.stopping:
            self.pending = [(now, signal.SIGKILL)]
        else:
            self._witness(None)  # what the job was doing when the operator gave up on it
            self._begin_stopping()
            forwarded = signal.Signals(received[0])
            self.pending = [
                (now, forwarded),
                (now + grace_s, signal.SIGTERM),
                (now + 2 * grace_s, signal.SIGKILL),
            ]

    def _escalate(self) -> None:
        now = time.monotonic()
        while self.pending and self.pending[0][0] <= now:
            _, sig = self.pending.pop(0)
            for rank, proc in enumerate(self.procs):
                if rank not in self.exits:
                    _signal_group(proc.pid, sig)

    def _kill_all(self) -> None:
        """Whatever is left in any rank's process group (the rank's own children too) dies."""
        for proc in self.procs:
            _signal_group(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()

    def _catch_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None  # only the main thread may handle signals

        def handler(signum: int, frame: FrameType | None) -> None:
            self.signals.append(signum)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    def _result(self, timed_out: bool, timeout_s: float | None) -> LaunchResult:
        exits = [self.exits[rank] for rank in range(len(self.procs))]
        failure = self.first_failure
        if self.interrupted_by is not None:
            code = SIGNAL_EXIT_BASE + self.interrupted_by
        elif failure is not None:
            code = failure.returncode if failure.returncode > 0 else EXIT_ERROR
        else:
            code = EXIT_ERROR if timed_out else 0
        interrupted = self.interrupted_by is not None
        return LaunchResult(
            code,
            None if interrupted else failure,
            exits,
            timed_out=timed_out,
            timeout_s=timeout_s,
            interrupted=interrupted,
            others_stopped=self.others_stopped,
            job=self.envs[0]["CCLCTL_JOB"],
            store_address=self.envs[0]["CCLCTL_STORE"],
            order=list(self.order),
            launcher_revoked=self.launcher_revoked,
            store=None if self.witness is None else self.witness.look(),
        )


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(pid, sig)
