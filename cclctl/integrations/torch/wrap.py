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
from typing import Any

from cclctl.config import RuntimeConfig, runtime_from_env
from cclctl.errors import UsageError
from cclctl.integrations.torch.calls import OPS, describer, quick_layout
from cclctl.integrations.torch.session import Session
from cclctl.integrations.torch.wrappers import State, wrap_general, wrap_quick

log = logging.getLogger("cclctl.torch")


_state: State | None = None
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
        state = State(dist, config, flags)
        c10d = dist.distributed_c10d
        for name in OPS:
            original = getattr(c10d, name, None)
            if original is None:
                continue  # an older torch without this function
            wrapper = wrap_general(state, original, describer(name, original, torch.Tensor))
            quick = quick_layout(name, original)
            if quick is not None:
                wrapper = wrap_quick(state, original, OPS[name], quick, torch.Tensor, wrapper)
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


def _patch(state: State, name: str, wrapper: Callable[..., Any]) -> None:
    c10d = state.dist.distributed_c10d
    state.originals[name] = getattr(c10d, name)
    setattr(c10d, name, wrapper)
    if hasattr(state.dist, name):
        setattr(state.dist, name, wrapper)


def _wrap_init(state: State, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _open_session(state)
        return result

    return init_process_group


def _wrap_destroy(state: State, original: Callable[..., Any]) -> Callable[..., Any]:
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


def _wrap_work_wait(state: State, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        sess = state.session
        if sess is not None:
            sess.completions.waited(self)
        return result

    return wait


def _open_session(state: State) -> None:
    """Start telemetry for the default group; a failure is logged, never raised."""
    if state.session is not None:
        return
    try:
        cfg = state.cfg.replace(**state.flags) if state.cfg else runtime_from_env(**state.flags)
        world = state.dist.distributed_c10d._get_default_group()
        state.set_session(Session(cfg, state.dist, world).start())
    except Exception as exc:
        log.warning("cclctl: torch.distributed runs without cclctl telemetry: %s", exc)


def _close_session(state: State | None = None) -> None:
    state = state if state is not None else _state
    if state is None or state.session is None:
        return
    sess = state.session
    state.set_session(None)
    try:
        sess.close()
    except Exception as exc:
        log.warning("cclctl: closing telemetry failed: %s", exc)
