"""cclctl's counters, flight recorder, status, exporter and watchdog for torch.distributed.

``instrument()`` wraps torch.distributed's collectives (and ``init_process_group`` /
``destroy_process_group``, which start and end the session); ``uninstrument()`` puts the
originals back. A wrapped call passes its arguments through untouched and returns or raises
exactly what torch does: the wrapper only opens a record before and closes it when the work
has ended (see :mod:`~cclctl.integrations.torch.timing`).

Calls made from inside a wrapped call (``all_gather_into_tensor`` calls
``all_gather_single``; ``all_gather_object`` calls ``all_gather``) are counted once, by the
outermost wrapper. Collectives issued from C++ (DDP's reducer, functional collectives) never
pass through torch.distributed's Python functions and are not seen; PyTorch's Flight
Recorder sees those (``cclctl diagnose hang`` reads its dumps).
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
from collections.abc import Callable
from threading import get_ident
from time import time_ns
from typing import Any

from cclctl.config import RuntimeConfig, runtime_from_env
from cclctl.errors import UsageError
from cclctl.integrations.torch.calls import (
    OPS,
    Call,
    Describe,
    QuickLayout,
    describer,
    quick_layout,
)
from cclctl.integrations.torch.folding import FOLD_BACKSTOP
from cclctl.integrations.torch.session import QUICK_END, Session, quietly
from cclctl.records import CollectiveRecord

log = logging.getLogger("cclctl.torch")


class _State:
    """What one instrumented process keeps: the originals and the live session."""

    def __init__(self, dist: Any, cfg: RuntimeConfig | None, flags: dict[str, Any]) -> None:
        self.dist = dist
        self.cfg = cfg
        self.flags = flags
        self.originals: dict[str, Callable[..., Any]] = {}
        self.work_wait: Callable[..., Any] | None = None
        self.session: Session | None = None
        #: threads now inside a wrapped call, whose inner wrapped calls pass through. A set
        #: of idents, not a ``threading.local``: the common case is an empty set, one
        #: truth test, where reading a thread-local cost ~0.5 us between gloo calls.
        self.inside: set[int] = set()

    def set_session(self, sess: Session | None) -> None:
        """Make ``sess`` (or no session) the one every wrapper reports to."""
        self.session = sess


_state: _State | None = None
_lock = threading.Lock()


def instrument(config: RuntimeConfig | None = None, **flags: Any) -> None:
    """Wrap torch.distributed's collectives with cclctl's telemetry. Idempotent.

    Call it before or after ``init_process_group``. ``config`` or ``flags`` (fields of
    :class:`~cclctl.config.RuntimeConfig`: ``timeout_s=30``, ``trace_dir="/tmp/x"``, ...)
    override the ``CCLCTL_*`` environment, which is read when the session starts.
    Raises UsageError when torch.distributed is not available.
    """
    global _state
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("torch.distributed is not available in this build of torch")
    with _lock:
        if _state is not None:
            return
        state = _State(dist, config, flags)
        c10d = dist.distributed_c10d
        for name in OPS:
            original = getattr(c10d, name, None)
            if original is None:
                continue  # an older torch without this function
            wrapper = _wrap(state, original, describer(name, original, torch.Tensor))
            quick = quick_layout(name, original)
            if quick is not None:
                wrapper = _wrap_quick(state, original, OPS[name], quick, torch.Tensor, wrapper)
            _patch(state, name, wrapper)
        _patch(state, "init_process_group", _wrap_init(state, c10d.init_process_group))
        _patch(state, "destroy_process_group", _wrap_destroy(state, c10d.destroy_process_group))
        state.work_wait = c10d.Work.wait
        c10d.Work.wait = _wrap_work_wait(state, c10d.Work.wait)  # type: ignore[method-assign]
        _state = state
    atexit.register(_close_session)
    if dist.is_initialized():
        _open_session(state)


def uninstrument() -> None:
    """End the session (final status, threads stopped) and restore torch's functions."""
    global _state
    with _lock:
        state, _state = _state, None
    if state is None:
        return
    _close_session(state)
    c10d = state.dist.distributed_c10d
    for name, original in state.originals.items():
        for module in (c10d, state.dist):
            if getattr(module, name, None) is not None:
                setattr(module, name, original)
    if state.work_wait is not None:
        c10d.Work.wait = state.work_wait


def session() -> Session | None:
    """The live session of this process (None before init_process_group or when not
    instrumented): its ``telemetry`` holds the counters and the flight recorder.
    """
    return _state.session if _state is not None else None


def _patch(state: _State, name: str, wrapper: Callable[..., Any]) -> None:
    c10d = state.dist.distributed_c10d
    state.originals[name] = getattr(c10d, name)
    setattr(c10d, name, wrapper)
    if hasattr(state.dist, name):
        setattr(state.dist, name, wrapper)


def _wrap(state: _State, original: Callable[..., Any], describe: Describe) -> Callable[..., Any]:
    """The wrapper of one function. Written flat, without helper calls on the common path
    (a synchronous CPU call): each Python call there costs a few hundred nanoseconds.
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


def _wrap_quick(
    state: _State,
    original: Callable[..., Any],
    op: str,
    layout: QuickLayout,
    tensor_type: Any,
    general: Callable[..., Any],
) -> Callable[..., Any]:
    """The wrapper of a one-tensor collective (all_reduce): its common call, synchronous on
    a CPU tensor and a group the session knows, is read and handed over in this one Python
    call, as a list (the layout of ``torch_session.quick_call``), and numbered and
    recorded later, off this thread (see :mod:`~cclctl.integrations.torch.session`); any
    other call goes to ``general``, the wrapper of :func:`_wrap`, which also makes a new
    group known. Between two gloo calls caches are cold, and each step costs several times
    what it does in a loop (the main thread's CPU in benchmarks/torch_overhead.py), so
    every torch call, Python call and attribute read saved counts.
    """
    inside = state.inside
    i_tensor, name, i_group, i_async = layout
    gpus = _cuda_built()  # a CPU-only torch makes no CUDA tensors: no need to ask each one
    at_end = QUICK_END

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
        call = [group, tensor, op, time_ns(), 0, None]  # torch_session.quick_call, inline
        sess.hand(call)
        try:  # not marked inside: these functions call no other wrapped function
            result = original(*args, **kwargs)
        except BaseException as exc:
            quietly(sess.fail_quick, call, exc)
            raise
        call[at_end] = time_ns()  # the call has ended: its record is built and ended later
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


def _wrap_init(state: _State, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _open_session(state)
        return result

    return init_process_group


def _wrap_destroy(state: _State, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs.get("group")
        sess = state.session
        if sess is not None:
            if group is None or group is sess.world:
                _close_session(state)
            else:
                sess.forget(group)
        return original(*args, **kwargs)

    return destroy_process_group


def _wrap_work_wait(state: _State, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        sess = state.session
        if sess is not None:
            sess.completions.waited(self)
        return result

    return wait


def _open_session(state: _State) -> None:
    """Start telemetry for the default group; a failure is logged, never raised."""
    if state.session is not None:
        return
    try:
        cfg = state.cfg.replace(**state.flags) if state.cfg else runtime_from_env(**state.flags)
        world = state.dist.distributed_c10d._get_default_group()
        state.set_session(Session(cfg, state.dist, world).start())
    except Exception as exc:
        log.warning("cclctl: torch.distributed runs without cclctl telemetry: %s", exc)


def _close_session(state: _State | None = None) -> None:
    state = state if state is not None else _state
    if state is None or state.session is None:
        return
    sess = state.session
    state.set_session(None)
    try:
        sess.close()
    except Exception as exc:
        log.warning("cclctl: closing telemetry failed: %s", exc)
