"""A rank's Python stack in one line: where its main thread is, in the user's own code.

"rank 2 is in train.py:41 load_batch -> time.sleep": the innermost frame of the user's code
(not the standard library, installed packages or cclctl), then what it calls there (read
from its source line, when the stack has it), then the innermost frame when that is deeper
still. Files are classified by their paths as the rank saw them; no file is read.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence

from cclctl.stack_records import Frame, ThreadStack

USER = "user"
STDLIB = "stdlib"
LIBRARY = "library"
CCLCTL = "cclctl"

_PACKAGES = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
_STDLIB = re.compile(r"[/\\]lib(?:64)?[/\\]python3(?:\.\d+)?[/\\]|^<frozen ")
_CCLCTL = re.compile(
    r"[/\\]cclctl[/\\](?:(?:benchmark|commands|diagnose|diagnose_io|integrations|launch|live"
    r"|probes|runtime|store|telemetry)[/\\](?:\w+[/\\])*)?\w+\.py$"
)
_CALL = re.compile(r"([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)\s*\(")


def frame_kind(path: str) -> str:
    """``"cclctl"``, ``"library"`` (site-packages), ``"stdlib"`` or ``"user"``."""
    if _CCLCTL.search(path):
        return CCLCTL
    if _PACKAGES.search(path):
        return LIBRARY
    return STDLIB if _STDLIB.search(path) else USER


def main_stack(stacks: Sequence[ThreadStack]) -> ThreadStack | None:
    """The stack that says where the rank is: the main thread's, else the first one."""
    for stack in stacks:
        if stack.main and stack.frames:
            return stack
    return next((s for s in stacks if s.frames), None)


def short_file(path: str) -> str:
    """``train.py`` for ``/home/me/job/train.py`` (``pkg/__init__.py`` for a package)."""
    parts = re.split(r"[/\\]", path)
    if len(parts) > 1 and parts[-1] == "__init__.py":
        return "/".join(parts[-2:])
    return parts[-1]


def place(frame: Frame) -> str:
    """``train.py:41 load_batch``."""
    return f"{short_file(frame.file)}:{frame.line} {frame.func}"


def called_in(code: str) -> str:
    """The function a source line calls first (``time.sleep`` in ``time.sleep(60)``)."""
    for match in _CALL.finditer(code):
        name = re.sub(r"\s+", "", match.group(1))
        if not keyword.iskeyword(name.split(".")[0]):
            return name
    return ""


def one_line(stack: ThreadStack) -> str:
    """``train.py:41 load_batch -> time.sleep`` ("" for a stack without frames)."""
    frames = stack.frames
    if not frames:
        return ""
    users = [i for i, f in enumerate(frames) if frame_kind(f.file) == USER]
    at = users[-1] if users else len(frames) - 1
    deeper = frames[at + 1 :]
    parts = [place(frames[at])]
    callee = called_in(frames[at].code)
    if callee:
        parts.append(callee)
    if deeper:
        parts.append(place(deeper[-1]))
    return " -> ".join(parts)


def stack_line(rank: int, stacks: Sequence[ThreadStack]) -> str:
    """``"rank 2 is in train.py:41 load_batch -> time.sleep"`` ("" without a stack)."""
    stack = main_stack(stacks)
    line = one_line(stack) if stack is not None else ""
    if not line:
        return ""
    assert stack is not None
    if stack.call:
        return f"rank {rank} called {stack.call} from {line} (Flight Recorder)"
    thread = "" if stack.main else f" (thread {stack.name})"
    return f"rank {rank} is in {line}{thread}"


def format_stack(stack: ThreadStack) -> list[str]:
    """The whole stack, outermost first, as ``traceback`` prints it (two lines a frame)."""
    title = f"thread {stack.name}" + (" (main)" if stack.main else "")
    if stack.call:
        title = f"{stack.name}: where {stack.call} was called"
    lines = [title]
    if stack.omitted:
        lines.append(f"  ... {stack.omitted} outer frames left out")
    for f in stack.frames:
        lines.append(f'  File "{f.file}", line {f.line}, in {f.func}')
        if f.code:
            lines.append(f"    {f.code}")
    return lines
