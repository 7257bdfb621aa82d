"""Fault injection (``CCLCTL_FAULT``): rehearse an incident on purpose, at a chosen rank and seq.

Tests use it to prove that diagnosis names the right rank; SREs use it to see what an
incident looks like in ``cclctl top`` and ``cclctl diagnose hang`` before the real one.
A plan is a ``;``-separated list of faults, each ``KIND:key=value:...``::

    kill:rank=2:seq=5                 the rank SIGKILLs itself before entering seq 5
    stop:rank=2:seq=5                 the rank SIGSTOPs itself (frozen, heartbeat stops);
                                      continued, it enters seq 5 half a second later
    sleep:rank=2:seq=5:secs=3         the rank is slow: it enters seq 5 three seconds late
    skip:rank=2:seq=5                 the rank never enters seq 5 (it waits outside, alive,
                                      as a rank stuck in its own code does)
    op:rank=2:seq=5:to=broadcast      the rank calls a different collective at seq 5
    count:rank=2:seq=5:to=7           ... the same collective with a different count
    dtype:rank=2:seq=5:to=float64     ... with a different dtype
    link:rank=2:seq=5:peer=3          the rank closes its link to rank 3 before seq 5
    slow:rank=2:seq=5:delay=0.02      the rank is persistently slow: from seq 5 on it
                                      enters every collective 20 ms late
    slow:rank=2:seq=5:factor=0.3      ... late by 0.3 of the time since its previous call
                                      ended (its step: a compute straggler 30% slower)

``rank`` is the job's rank, in a shrunk communicator too; ``comm=ID``, last, restricts a
fault to one communicator (default: any). Every fault but ``slow`` strikes one seq; ``slow``
strikes every collective from its seq on (its retries too), beside any other fault.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable

from cclctl.bandwidth import COLLECTIVES
from cclctl.errors import ConfigError
from cclctl.runtime.transport.base import LinkCutter
from cclctl.runtime.transport.wire import DTYPE_NAMES

#: How long a stopped rank waits, once continued, before it enters the collective: a
#: SIGTERM sent while it was stopped (a launcher ending the job) may be taken by another
#: thread, and the main thread must run its handler (the dump) before the call starts, or
#: the dump shows a call the rank never really made.
RESUME_PAUSE_S = 0.5

KINDS = ("kill", "stop", "sleep", "skip", "op", "count", "dtype", "link", "slow")
_ARGS = {"sleep": "secs", "op": "to", "count": "to", "dtype": "to", "link": "peer"}
#: ``slow``'s two ways to be slow, one per fault, and the largest value of each
SLOW_MODES = {"delay": 60.0, "factor": 100.0}


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    seq: int
    comm: str = ""
    arg: str = ""
    mode: str = ""  # slow: "delay" (arg: seconds) or "factor" (arg: a fraction of the step)

    def matches(self, rank: int, seq: int, comm: str) -> bool:
        return self.rank == rank and self.seq == seq and (not self.comm or self.comm == comm)


def _fail(item: str, why: str) -> ConfigError:
    return ConfigError(f"CCLCTL_FAULT item {item!r}: {why}", variable="CCLCTL_FAULT")


def _parse_one(item: str) -> Fault:
    head, _, comm = item.partition(":comm=")  # last: a comm id may hold ':' and ','
    kind, *pairs = head.split(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise _fail(item, f"unknown fault {kind!r}; use one of {', '.join(KINDS)}")
    fields: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise _fail(item, f"{pair!r} is not key=value")
        fields[key.strip()] = value.strip()
    try:
        rank, seq = int(fields.pop("rank")), int(fields.pop("seq"))
    except KeyError as missing:
        raise _fail(item, f"missing {missing.args[0]}=") from None
    except ValueError:
        raise _fail(item, "rank and seq must be integers") from None
    if rank < 0 or seq < 1:
        raise _fail(item, "rank must be >= 0 and seq >= 1")
    comm = comm.strip()
    if kind == "slow":
        return _parse_slow(item, rank, seq, comm, fields)
    want = _ARGS.get(kind)
    arg = fields.pop(want, "") if want else ""
    if fields:
        raise _fail(item, f"unexpected {', '.join(sorted(fields))}")
    if want and not arg:
        raise _fail(item, f"{kind} needs {want}=")
    _check_arg(item, kind, arg)
    return Fault(kind, rank, seq, comm, arg)


def _parse_slow(item: str, rank: int, seq: int, comm: str, fields: dict[str, str]) -> Fault:
    """``slow``: exactly one of ``delay=SECONDS`` and ``factor=FRACTION``."""
    modes = [mode for mode in SLOW_MODES if mode in fields]
    if len(modes) != 1:
        raise _fail(item, "slow needs one of delay= (seconds) or factor= (a fraction of the step)")
    mode = modes[0]
    arg = fields.pop(mode)
    if fields:
        raise _fail(item, f"unexpected {', '.join(sorted(fields))}")
    try:
        value = float(arg)
    except ValueError:
        value = -1.0
    if not 0 <= value <= SLOW_MODES[mode]:  # NaN fails too
        raise _fail(item, f"{mode}={arg!r} must be a number from 0 to {SLOW_MODES[mode]:g}")
    return Fault("slow", rank, seq, comm, arg, mode)


def _check_arg(item: str, kind: str, arg: str) -> None:
    if kind == "op" and arg not in COLLECTIVES:
        raise _fail(item, f"to={arg!r} is not a collective")
    if kind == "dtype" and arg not in DTYPE_NAMES[1:]:
        raise _fail(item, f"to={arg!r} is not a dtype cclctl sends")
    if kind in ("count", "link") and not arg.isdigit():
        raise _fail(item, f"{_ARGS[kind]}={arg!r} must be a non-negative integer")
    if kind == "sleep":
        try:
            if float(arg) < 0:
                raise ValueError
        except ValueError:
            raise _fail(item, f"secs={arg!r} must be a non-negative number") from None


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """The faults that strike one seq (``faults``) and the persistent ones (``slow``)."""

    faults: tuple[Fault, ...] = ()
    slow: tuple[Fault, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def at(self, rank: int, seq: int, comm: str) -> Fault | None:
        return next((f for f in self.faults if f.matches(rank, seq, comm)), None)

    def slowdown(self, rank: int) -> Slowdown | None:
        """What slows ``rank``'s calls down (None: nothing does)."""
        mine = tuple(f for f in self.slow if f.rank == rank)
        return Slowdown(mine) if mine else None


def parse(spec: str) -> FaultPlan:
    found = [_parse_one(item.strip()) for item in spec.split(";") if item.strip()]
    return FaultPlan(
        tuple(f for f in found if f.kind != "slow"), tuple(f for f in found if f.kind == "slow")
    )


class Slowdown:
    """A rank's ``slow`` faults on one communicator: before each collective from a fault's
    seq on, the rank sleeps ``delay`` seconds, or ``factor`` times the time since its
    previous call ended (the compute it did between calls), as a straggler would."""

    def __init__(self, faults: tuple[Fault, ...], clock: Callable[[], float] = time.monotonic):
        self.faults = faults
        self._clock = clock
        self._sleep = time.sleep
        self.last_end: float | None = None  # when this rank's previous call ended

    def delay_s(self, seq: int, comm: str) -> float:
        """How long the collective at ``seq`` of ``comm`` enters late."""
        total = 0.0
        for fault in self.faults:
            if seq < fault.seq or (fault.comm and fault.comm != comm):
                continue
            if fault.mode == "delay":
                total += float(fault.arg)
            elif self.last_end is not None:
                total += float(fault.arg) * max(0.0, self._clock() - self.last_end)
        return total

    def before(self, seq: int, comm: str) -> None:
        """Enter the collective at ``seq`` late, as the plan says."""
        delay = self.delay_s(seq, comm)
        if delay > 0:
            self._sleep(delay)

    def ended(self) -> None:
        """A call of this rank ended now (its next step starts)."""
        self.last_end = self._clock()


class Injector:
    """The plan's hold on the calls of communicator ``comm`` at job rank ``rank``: only the
    faults that can strike there. Calls hold one only when there is something to inject
    (:func:`injector`), so a job without ``CCLCTL_FAULT`` pays nothing for it."""

    def __init__(self, plan: FaultPlan, rank: int, comm: str) -> None:
        self.faults = _striking(plan.faults, rank, comm)
        slow = _striking(plan.slow, rank, comm)
        #: the persistent slowdown of this rank (``slow``), else None
        self.slow = Slowdown(slow) if slow else None
        self._rank = rank
        self._comm = comm

    def before(
        self, seq: int, attempt: int, collective: bool, op: str, count: int, dtype: str,
        cutter: object,
    ) -> tuple[str, int, str]:  # fmt: skip
        """A call at ``seq`` is about to start: enter it late (``slow``, collectives only),
        then let the fault of that seq strike, once (``attempt`` 1). Returns what the call
        then claims to be; ``cutter``: the transport whose link a ``link`` fault cuts."""
        if self.slow is not None and collective:
            self.slow.before(seq, self._comm)
        fault = next((f for f in self.faults if f.matches(self._rank, seq, self._comm)), None)
        if fault is None or attempt != 1:  # an injected incident strikes once per seq
            return op, count, dtype
        return strike(fault, op, count, dtype, lambda peer: cut_link(cutter, peer))

    def ended(self) -> None:
        """A call of this rank ended now (a ``factor`` slowdown measures from here)."""
        if self.slow is not None:
            self.slow.ended()


def _striking(found: tuple[Fault, ...], rank: int, comm: str) -> tuple[Fault, ...]:
    return tuple(f for f in found if f.rank == rank and f.comm in ("", comm))


def injector(plan: FaultPlan, rank: int, comm: str) -> Injector | None:
    """What ``plan`` injects into ``comm``'s calls at job rank ``rank`` (None: nothing)."""
    mine = Injector(plan, rank, comm)
    return mine if mine.faults or mine.slow is not None else None


def cut_link(transport: object, peer: int) -> None:
    """Cut ``transport``'s link to ``peer``, which it must offer (:class:`LinkCutter`)."""
    if not isinstance(transport, LinkCutter):
        name = getattr(transport, "name", type(transport).__name__)
        raise ConfigError(
            f"CCLCTL_FAULT link:...:peer={peer}: the {name} transport cannot cut a link",
            variable="CCLCTL_FAULT",
        )
    transport.drop_link(peer)


def strike(
    fault: Fault, op: str, count: int, dtype: str, drop_link: Callable[[int], None]
) -> tuple[str, int, str]:
    """Apply ``fault`` to a call about to start. Returns what the call then claims to be
    (op, count, dtype: the mismatches); the other faults are carried out here (a cut link,
    or a kill, stop, sleep or skip)."""
    if fault.kind == "op":
        return fault.arg, count, dtype
    if fault.kind == "count":
        return op, int(fault.arg), dtype
    if fault.kind == "dtype":
        return op, count, fault.arg
    if fault.kind == "link":
        drop_link(int(fault.arg))
    else:
        act_before_entering(fault)
    return op, count, dtype


def act_before_entering(fault: Fault) -> None:
    """Carry out the faults that strike before a rank enters the collective."""
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(RESUME_PAUSE_S)
    elif fault.kind == "sleep":
        time.sleep(float(fault.arg))
    elif fault.kind == "skip":
        threading.Event().wait()  # never returns: the rank is stuck outside the collective
