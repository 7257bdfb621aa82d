"""Python stacks in rank documents: what each thread of a rank was doing when it dumped.

A dump's optional ``stacks`` field is a list of threads, each with its frames outermost
first (as ``traceback`` prints them). Sizes are bounded on both sides: the writer keeps the
innermost :data:`MAX_FRAMES` frames of at most :data:`MAX_THREADS` threads and cuts long
strings, and the reader refuses a document past those bounds, so a corrupt or hostile dump
cannot make a diagnosis parse megabytes of frames. Standard library only, like records.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cclctl.errors import BadInput

#: Threads kept per dump (the main thread first, then by name).
MAX_THREADS = 32
#: Frames kept per thread: the innermost ones, where the thread is now.
MAX_FRAMES = 48
#: Characters kept of a file name, function name or thread name.
MAX_NAME = 400
#: Characters kept of a frame's source line.
MAX_CODE = 200


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """One frame: file, line, function (its qualified name) and the source line, stripped."""

    file: str
    line: int
    func: str
    code: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "func": self.func, "code": self.code}


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's stack, outermost frame first; ``omitted`` outer frames were cut.

    ``call`` is empty for a stack taken when the dump was written. A PyTorch Flight Recorder
    dump records instead where a collective was called; ``call`` then names that collective
    ("all_reduce seq 12 of comm 0:0-3"), since it says where the rank was, not where it is.
    """

    name: str
    frames: tuple[Frame, ...]
    main: bool = False
    ident: int = 0
    omitted: int = 0
    call: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ident": self.ident,
            "main": self.main,
            "omitted": self.omitted,
            "call": self.call,
            "frames": [f.to_dict() for f in self.frames],
        }


def _fail(where: str, why: str) -> BadInput:
    return BadInput(f"{where}: {why}", where=where)


def _text(data: Mapping[str, Any], key: str, limit: int, where: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str) or len(value) > limit:
        raise _fail(where, f"field {key!r} must be a string of at most {limit} characters")
    return value


def _count(data: Mapping[str, Any], key: str, where: str) -> int:
    value = data.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _fail(where, f"field {key!r} must be a non-negative integer")
    return value


def frame_from_dict(data: object, where: str) -> Frame:
    if not isinstance(data, Mapping):
        raise _fail(where, "a frame must be an object")
    return Frame(
        file=_text(data, "file", MAX_NAME, where),
        line=_count(data, "line", where),
        func=_text(data, "func", MAX_NAME, where),
        code=_text(data, "code", MAX_CODE, where),
    )


def stack_from_dict(data: object, where: str) -> ThreadStack:
    if not isinstance(data, Mapping):
        raise _fail(where, "a thread's stack must be an object")
    frames = data.get("frames", [])
    if not isinstance(frames, list) or len(frames) > MAX_FRAMES:
        raise _fail(where, f"field 'frames' must be a list of at most {MAX_FRAMES} frames")
    main = data.get("main", False)
    if not isinstance(main, bool):
        raise _fail(where, "field 'main' must be true or false")
    return ThreadStack(
        name=_text(data, "name", MAX_NAME, where),
        frames=tuple(frame_from_dict(f, f"{where}: frame {i}") for i, f in enumerate(frames)),
        main=main,
        ident=_count(data, "ident", where),
        omitted=_count(data, "omitted", where),
        call=_text(data, "call", MAX_NAME, where),
    )


def stacks_from_list(data: object, where: str) -> list[ThreadStack]:
    """Validate a document's ``stacks`` (absent or null: none, as older writers leave it)."""
    if data is None:
        return []
    if not isinstance(data, list) or len(data) > MAX_THREADS:
        raise _fail(where, f"field 'stacks' must be a list of at most {MAX_THREADS} threads")
    return [stack_from_dict(s, f"{where}: stacks {i}") for i, s in enumerate(data)]


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
