"""The wrapper of one torch.distributed function: the quick path of a synchronous one-tensor
call, and the general path of every other call, which reads it into a :class:`Call`."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from threading import get_ident
from time import time_ns
from typing import Any

from cclctl.config import RuntimeConfig
from cclctl.integrations.torch.calls import Call, Describe, QuickLayout
from cclctl.integrations.torch.folding import FOLD_BACKSTOP
from cclctl.integrations.torch.session import QUICK_END, Session, quietly
from cclctl.records import CollectiveRecord

log = logging.getLogger("cclctl.torch")


class State:
    """What one instrumented process keeps: the originals and the live session."""

    def __init__(self, dist: Any, cfg: RuntimeConfig | None, flags: dict[str, Any]) -> None:
        self.dist = dist
        self.cfg = cfg
        self.flags = flags
        self.originals: dict[str, Callable[..., Any]] = {}
        self.work_wait: Callable[..., Any] | None = None
        self.session: Session | None = None
        #: threads now inside a wrapped call, whose inner wrapped calls pass through (a
        #: set of idents: the common case, an empty set, is one truth test)
        self.inside: set[int] = set()

    def set_session(self, sess: Session | None) -> None:
        """Make ``sess`` (or no session) the one every wrapper reports to."""
        self.session = sess


def wrap_general(
    state: State, original: Callable[..., Any], describe: Describe
) -> Callable[..., Any]:
    """The wrapper of any wrapped function: it reads the call (:mod:`.calls`), opens its
    record, and closes it when the call returns or, for early-returning work, when it ends.
    """
    inside = state.inside

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sess = state.session
        if sess is None or (inside and get_ident() in inside):
            return original(*args, **kwargs)
        rec = None
        try:
            call = describe(args, kwargs)
            comm = None if call is None else sess.comm(call.group)
            if call is not None and comm is not None:
                cuda = call.tensor is not None and call.tensor.is_cuda
                events = _cuda_events() if cuda else None
                rec = sess.open_record(comm, call)
        except Exception:
            log.exception("cclctl: torch telemetry failed; this call is not traced")
        if rec is None or call is None:
            return original(*args, **kwargs)  # not ours to trace: torch judges it
        me = get_ident()
        inside.add(me)  # set.add and discard are atomic under the GIL: no lock
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            quietly(sess.close_record, rec, exc, 0)
            raise
        finally:
            inside.discard(me)
        try:
            if events is None and (result is None or not call.is_async):
                sess.close_record(rec, None, 0)  # ended (sync on CPU, or coalesced)
            else:
                _follow(sess, rec, call, events, result)
        except Exception:  # telemetry must never change what the job sees
            log.exception("cclctl: torch telemetry failed")
        return result

    return wrapper


def wrap_quick(
    state: State,
    original: Callable[..., Any],
    op: str,
    layout: QuickLayout,
    tensor_type: Any,
    general: Callable[..., Any],
) -> Callable[..., Any]:
    """The wrapper of a one-tensor collective (all_reduce): its common call, synchronous on
    a CPU tensor and a group the session knows, is handed over as a quick call and recorded
    later, off this thread (see :mod:`~cclctl.integrations.torch.session`); any other call
    goes to ``general``, the wrapper of :func:`wrap_general`, which also makes a new group
    known. It reads the arguments inline: this is the path of most calls.
    """
    inside = state.inside
    i_tensor, name, i_group, i_async = layout
    gpus = _cuda_built()  # a CPU-only torch makes no CUDA tensors: no need to ask each one

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sess = state.session
        if sess is None or (inside and get_ident() in inside):
            return original(*args, **kwargs)
        n = len(args)
        tensor: Any = args[i_tensor] if i_tensor < n else kwargs.get(name)
        if type(tensor) is not tensor_type or (gpus and tensor.is_cuda):
            return general(*args, **kwargs)
        if args[i_async] if i_async < n else kwargs.get("async_op"):
            return general(*args, **kwargs)
        group = args[i_group] if i_group < n else kwargs.get("group")
        try:
            if group is not None and group not in sess.comms:
                return general(*args, **kwargs)  # a new group, a non-member's, or no group
        except TypeError:  # unhashable: not a process group, and torch will say so
            return original(*args, **kwargs)
        call = [group, tensor, op, time_ns(), 0, None]  # a quick call: see session.QUICK_*
        sess.quick.append(call)
        try:  # not marked inside: these functions call no other wrapped function
            result = original(*args, **kwargs)
        except BaseException as exc:
            quietly(sess.fail_quick, call, exc)
            raise
        call[QUICK_END] = time_ns()  # the call has ended: its record is built and ended later
        if len(sess.quick) >= FOLD_BACKSTOP:  # the session's folder has fallen behind
            quietly(sess.fold)
        return result

    return wrapper


def _follow(
    sess: Session,
    rec: CollectiveRecord,
    call: Call,
    events: tuple[Any, Any] | None,
    result: Any,
) -> None:
    """Arrange for the record to close when the work of an early-returning call ends."""
    if events is not None:
        start, end = events
        end.record()
        sess.completions.on_events(rec, start, end, result if call.is_async else None)
    elif not sess.completions.on_future(rec, result):
        sess.completions.on_wait_or_poll(rec, result)


def _cuda_built() -> bool:
    """Whether this torch can make CUDA (or ROCm) tensors at all."""
    import torch

    return bool(torch.backends.cuda.is_built())


def _cuda_events() -> tuple[Any, Any]:
    """A start event recorded now on the current stream, and an end event to record."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end
