"""Take the Python stack of every thread of this process, for a dump.

The dumping thread reads the others' frames with ``sys._current_frames()`` (no py-spy, no
signal to the stuck thread, which may be blocked in C and never run a handler), so a dump
written by the watchdog, a signal's helper thread or a termination handler shows where the
main thread is. The dumping thread itself is left out unless it is the main thread (its
own stack is cclctl writing the dump). A dump trigger that runs on the main thread (the
SIGTERM handler, the excepthook) is cut from its stack with everything it called: the
stack ends where the thread was when the trigger interrupted it. Bounds are
:mod:`cclctl.stack_records`'.
"""

from __future__ import annotations

import linecache
import sys
import threading
import traceback
from types import FrameType

from cclctl.stack_records import (
    MAX_CODE,
    MAX_FRAMES,
    MAX_NAME,
    MAX_THREADS,
    Frame,
    ThreadStack,
    clip,
)
from cclctl.telemetry import dumps


def capture_stacks() -> list[ThreadStack]:
    """Every thread's stack but the caller's (unless it is the main thread): main first."""
    me = threading.get_ident()
    main = threading.main_thread().ident
    names = {t.ident: t.name for t in threading.enumerate()}
    tops = sys._current_frames()
    try:
        stacks = [
            _thread_stack(ident, top, names.get(ident, f"thread {ident}"), ident == main)
            for ident, top in tops.items()
            if ident != me or ident == main
        ]
    finally:
        del tops  # frames hold their locals alive; drop them at once
    stacks.sort(key=lambda s: (not s.main, s.name, s.ident))
    return stacks[:MAX_THREADS]


def _thread_stack(ident: int, top: FrameType, name: str, main: bool) -> ThreadStack:
    walked = list(traceback.walk_stack(top))  # innermost first; cheap until lines are read
    cut = max((i + 1 for i, (f, _) in enumerate(walked) if _is_trigger(f)), default=0)
    kept = walked[cut:]
    inner = [_frame(frame, lineno) for frame, lineno in kept[:MAX_FRAMES]]
    inner.reverse()
    omitted = max(0, len(kept) - MAX_FRAMES)
    return ThreadStack(clip(name, MAX_NAME), tuple(inner), main, ident, omitted)


def _is_trigger(frame: FrameType) -> bool:
    """A frame of a dump trigger's own code (see :mod:`cclctl.telemetry.dumps`)."""
    code = frame.f_code
    return code.co_filename == dumps.__file__ and code.co_name in dumps.TRIGGERS


def _frame(frame: FrameType, lineno: int | None) -> Frame:
    code = frame.f_code
    line = lineno or 0
    source = linecache.getline(code.co_filename, line).strip() if line else ""
    return Frame(
        file=clip(code.co_filename, MAX_NAME),
        line=line,
        func=clip(getattr(code, "co_qualname", code.co_name), MAX_NAME),
        code=clip(source, MAX_CODE),
    )
