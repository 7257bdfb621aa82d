"""The wrapper process group: a Python subclass of c10d's ``ProcessGroup`` that traces every
collective and forwards it to the real process group it wraps.

torch calls a Python subclass's methods through its ``PyProcessGroup`` trampoline, from
Python (``dist.all_reduce`` calls ``group.allreduce``) and from C++ alike (DDP's reducer,
FSDP, ``_c10d_functional`` ops, eager and compiled), so this one place sees every
collective that reaches the group. Each traced method opens a record, calls the real group
with the same arguments and returns its ``Work`` untouched; the record closes when the work
completes (see :mod:`~cclctl.integrations.torch.timing`). The real backends are also
registered on the wrapper, so C++ helpers that ask a group for its backend
(``getBackend(cpu)``) keep working; what they issue there directly is not seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from cclctl.integrations.torch.calls import METHODS, describer
from cclctl.integrations.torch.session import Session, quietly

log = logging.getLogger("cclctl.torch")


class TorchTracer:
    """Traces the calls of one wrapper group: ``session()`` is the live session (or None)."""

    def __init__(self, session: Callable[[], Session | None], inner: Any, tensor: type) -> None:
        self.session = session
        self.inner = inner  # the real c10d ProcessGroup, whose backends do the work
        self.readers = {name: describer(name, tensor) for name in METHODS}
        self.backends: dict[str, Any] = {}  # device type -> backend, for torch's own seq
        self._runs: dict[str, Callable[..., Any]] = {}  # method -> the real group's, bound
        self._seqs: dict[bool, Callable[[], int] | None] = {}  # is_cuda -> its seq getter

    def call(self, method: str, group: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """``inner.<method>(*args, **kwargs)``, recorded when a session is live."""
        run = self._runs.get(method)
        if run is None:
            run = self._runs[method] = getattr(self.inner, method)
        sess = self.session()
        if sess is None:
            return run(*args, **kwargs)
        rec = call = events = None
        cuda = False
        try:
            call = self.readers[method](args)
            comm = None if call is None else sess.comm(group)
            if call is not None and comm is not None:
                cuda = call.tensor is not None and call.tensor.is_cuda
                events = _cuda_events() if cuda else None
                rec = sess.open_record(comm, call)
        except Exception:
            log.exception("cclctl: torch telemetry failed; this call is not traced")
        if rec is None or call is None:
            return run(*args, **kwargs)  # not ours to trace: torch judges it
        try:
            work = run(*args, **kwargs)
        except BaseException as exc:
            quietly(sess.close_record, rec, exc, 0)
            raise
        try:
            if call.direction is None:
                rec.torch_seq = self._torch_seq(cuda)
            _follow(sess, rec, events, work, _waited_at_once(args))
        except Exception:  # telemetry must never change what the job sees
            log.exception("cclctl: torch telemetry failed")
        return work

    def _torch_seq(self, cuda: bool) -> int | None:
        """The backend's own sequence number of the collective just issued (what PyTorch's
        Flight Recorder calls ``collective_seq_id``), or None if it has none: the CUDA
        backend's for CUDA tensors, else the CPU one's (the getter is looked up once)."""
        try:
            seq = self._seqs[cuda]
        except KeyError:
            device = "cuda" if cuda else "cpu"
            backend = self.backends.get(device) or next(iter(self.backends.values()), None)
            seq = self._seqs[cuda] = getattr(backend, "_get_sequence_number_for_group", None)
        return None if seq is None else int(seq())


def _waited_at_once(args: Sequence[Any]) -> bool:
    """True when the caller waits on the work in Python at once: torch's synchronous API
    passes options with ``asyncOp`` False (torch 2.7 and later) and calls ``wait()`` next.
    Everything else (``async_op=True``, DDP's reducer, FSDP, functional collectives, which
    wait in C++) says True or has no such field."""
    return bool(args) and getattr(args[-1], "asyncOp", True) is False


def _follow(
    sess: Session, rec: Any, events: tuple[Any, Any] | None, work: Any, at_wait: bool
) -> None:
    """Arrange for the record to close when the work ends: at the ``wait()`` that follows
    a synchronous call (a future's callback would run on gloo's thread and contend for
    the GIL with the caller, which costs more than the call itself at small sizes), else
    at the future's completion, else at ``wait()`` or a poll."""
    if work is None:
        sess.close_record(rec, None, 0)
    elif events is not None:
        start, end = events
        end.record()
        sess.completions.on_events(rec, start, end, work)
    elif at_wait:
        sess.completions.on_wait(rec, work)
    elif not sess.completions.on_future(rec, work):
        sess.completions.on_wait_or_poll(rec, work)


def _cuda_events() -> tuple[Any, Any]:
    """A start event recorded now on the current stream, and an end event to record."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end


def _traced(method: str) -> Callable[..., Any]:
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._cclctl_tracer.call(method, self, args, kwargs)

    traced.__name__ = traced.__qualname__ = method
    return traced


def _backend_name(self: Any) -> str:
    """The real group's backend name (``gloo``, ``nccl``), not the wrapper's."""
    return str(self._cclctl_tracer.inner.name())


def group_class(dist: Any) -> type:
    """The wrapper class, a subclass of this torch's ``ProcessGroup``: built from
    ``CclctlProcessGroup(inner, tracer)``, it traces :data:`~.calls.METHODS`; every other
    method is the base class's, which runs on the backends registered on the wrapper.
    """
    base = dist.ProcessGroup

    def __init__(self: Any, inner: Any, tracer: TorchTracer) -> None:
        base.__init__(self, inner.rank(), inner.size())
        self._cclctl_tracer = tracer

    attrs: dict[str, Any] = {name: _traced(name) for name in METHODS}
    attrs["getBackendName"] = _backend_name  # what C++ asks the trampoline for
    attrs["__doc__"] = "A process group traced by cclctl around the real one it wraps."
    attrs["__init__"] = __init__
    return type("CclctlProcessGroup", (base,), attrs)
