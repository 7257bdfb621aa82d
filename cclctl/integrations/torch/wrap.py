"""cclctl's counters, flight recorder, status, exporter and watchdog for torch.distributed.

``instrument()`` makes every process group torch creates from then on a cclctl wrapper
around the real one (:mod:`~cclctl.integrations.torch.groups`), so every collective that
reaches a group is recorded, whoever issued it: torch.distributed's Python API, DDP's
reducer, FSDP, functional collectives. ``init_process_group`` / ``destroy_process_group``
are wrapped to start and end the session, and ``Work.wait`` to close the records of works
without a future (gloo's point-to-point). ``uninstrument()`` puts torch's functions back.
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
from cclctl.integrations.torch.groups import Groups
from cclctl.integrations.torch.session import Session

log = logging.getLogger("cclctl.torch")


class State:
    """What one instrumented process keeps: torch's originals and the live session."""

    def __init__(self, dist: Any, cfg: RuntimeConfig | None, flags: dict[str, Any]) -> None:
        self.dist = dist
        self.cfg = cfg
        self.flags = flags
        self.originals: dict[str, Callable[..., Any]] = {}
        self.work_wait: Callable[..., Any] | None = None
        self.session: Session | None = None
        self.groups = Groups(dist, lambda: self.session)

    def set_session(self, sess: Session | None) -> None:
        """Make ``sess`` (or no session) the one every wrapper group reports to."""
        self.session = sess


_state: State | None = None
_lock = threading.Lock()


def instrument(config: RuntimeConfig | None = None, **flags: Any) -> None:
    """Make every process group torch creates from now on a traced one. Idempotent.

    Call it before ``init_process_group`` (``cclctl run`` does, at ``import torch``):
    groups that exist already are not seen. ``config`` or ``flags`` (fields of
    :class:`~cclctl.config.RuntimeConfig`: ``timeout_s=30``, ``trace_dir="/tmp/x"``, ...)
    override the ``CCLCTL_*`` environment, which is read when the session starts.
    Raises UsageError when torch.distributed is not available.
    """
    global _state
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("torch.distributed is not available in this build of torch")
    with _lock:
        if _state is not None:
            return
        state = State(dist, config, flags)
        c10d = dist.distributed_c10d
        state.groups.install()
        _patch(state, "init_process_group", _wrap_init(state, c10d.init_process_group))
        _patch(state, "destroy_process_group", _wrap_destroy(state, c10d.destroy_process_group))
        state.work_wait = c10d.Work.wait
        c10d.Work.wait = _wrap_work_wait(state, c10d.Work.wait)  # type: ignore[method-assign]
        _state = state
    atexit.register(_close_session)
    if dist.is_initialized():
        log.warning(
            "cclctl: instrument() after init_process_group: the groups that exist already "
            "are not traced; call it first (cclctl run does)"
        )
        _open_session(state)


def uninstrument() -> None:
    """End the session (final status, threads stopped) and restore torch's functions."""
    global _state
    with _lock:
        state, _state = _state, None
    if state is None:
        return
    sess = state.session
    _close_session(state)
    if sess is not None:
        sess.remove_dump_hooks()
    state.groups.uninstall()
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
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            sess = state.session
            if sess is not None:
                sess.completions.waited(self, exc)
            raise
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
