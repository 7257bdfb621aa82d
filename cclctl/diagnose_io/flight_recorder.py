"""Reading PyTorch Flight Recorder dumps: find them, parse them safely, hand them on.

PyTorch writes one file per rank, named ``<prefix><rank>`` (``nccl_trace_rank_3``), as a
pickle (``_dump_fr_trace``, the default) or JSON (``_dump_fr_trace_json``). A dump is
untrusted input, so pickles are loaded by an unpickler that resolves no class and no
persistent id: only dicts, lists, tuples, strings, bytes, numbers, booleans and None can
come out of it, and anything else is refused before it is built. Nothing here writes pickle.

:func:`load_flight_recorder` is what ``cclctl diagnose hang`` calls first: None means "no
Flight Recorder dump here", and the caller goes on with cclctl's own dump format.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import pickle
import re
from collections.abc import Iterator, Sequence
from typing import Any

from cclctl import limits
from cclctl.diagnose_io.fr_pool import read_all
from cclctl.diagnose_io.fr_snapshots import snapshots
from cclctl.diagnose_io.fr_translate import RankDump, read_rank
from cclctl.errors import BadInput
from cclctl.records import RankSnapshot

#: Larger than any real dump (2,000 entries with stack traces are a few MB).
MAX_BYTES = limits.MAX_FILE_BYTES
#: How much of a file is read to tell its format.
SNIFF_BYTES = 4096
PICKLE = "pickle"
JSON = "json"
_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|bin))?$")
_FR_KEYS = (b'"entries"', b'"pg_config"', b'"pg_status"')


class _PlainUnpickler(pickle.Unpickler):
    """Admits plain containers and numbers only: every global and persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: dumps hold plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing a persistent id: dumps hold plain data")


class _Peekable(io.BytesIO):
    """Bytes the unpickler can read ahead in. Given no ``peek``, it calls ``read`` for every
    opcode of an unframed pickle, and PyTorch writes its dumps unframed (protocol 2), which
    makes loading several times slower. (io.BufferedReader has ``peek`` too, but it
    allocates whatever length a corrupt opcode claims before finding the data short.)
    """

    def peek(self, size: int = 0) -> bytes:
        data = self.read(max(size, 1))
        self.seek(-len(data), io.SEEK_CUR)
        return data


def sniff(head: bytes) -> str | None:
    """``"pickle"``, ``"json"`` (a Flight Recorder JSON dump) or None from a file's start."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return PICKLE
    text = head.lstrip()
    is_object = text.startswith(b"{") and not text.startswith(b'{"schema"')
    return JSON if is_object and any(key in head for key in _FR_KEYS) else None


def parse(data: bytes, fmt: str, path: str) -> Any:
    """The dump as plain Python data; BadInput naming the file when it cannot be read."""
    with gc_paused():
        return _parse(data, fmt, path)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a parsed dump is alive.

    A dump is hundreds of thousands of containers, freed by their reference counts. Built
    while the collector runs, they would be scanned again and again; and the first
    collection after it resumes would scan them all once more, so :func:`read_dump` keeps
    it paused until the dump is condensed and freed.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _parse(data: bytes, fmt: str, path: str) -> Any:
    if fmt == PICKLE:
        try:
            return _PlainUnpickler(_Peekable(data)).load()
        except pickle.UnpicklingError as exc:
            why = f"not a usable Flight Recorder pickle ({exc})"
        except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError):
            why = "truncated or corrupt Flight Recorder pickle"
        except (MemoryError, RecursionError):
            why = "Flight Recorder pickle too large or nested too deeply"
        raise BadInput(f"{path}: {why}", path=path)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{path}: not valid JSON ({exc})", path=path) from None


def rank_of(path: str) -> int:
    """The rank PyTorch put at the end of the file name (``nccl_trace_rank_3`` -> 3)."""
    match = _RANK.search(os.path.basename(path))
    if match is None:
        raise BadInput(
            f"{path}: cannot tell which rank wrote this Flight Recorder dump; PyTorch names "
            "them <prefix><rank> (nccl_trace_rank_3)",
            path=path,
        )
    digits = match.group(1)
    return limits.rank(int(digits) if len(digits) <= 9 else 10**9, path, "the rank in its name")


def find_dumps(paths: Sequence[str]) -> list[tuple[str, str]] | None:
    """(path, format) of the Flight Recorder dumps among ``paths`` (files, or folders read
    one level deep), sorted by path; None when there is none. Other files are left to
    cclctl's own reader (a folder may hold both kinds: ``cclctl.diagnose_io.sources``).
    """
    found: list[tuple[str, str]] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                names = sorted(os.listdir(path))
            except OSError:
                continue  # the caller's loader words this error
            for name in names:
                full = os.path.join(path, name)
                if not name.startswith(".") and os.path.isfile(full):
                    fmt = _sniff_file(full)
                    if fmt is not None:
                        found.append((full, fmt))
        elif os.path.isfile(path):
            fmt = _sniff_file(path)
            if fmt is not None:
                found.append((path, fmt))
    return sorted(dict.fromkeys(found)) if found else None


def _sniff_file(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return sniff(fh.read(SNIFF_BYTES))
    except OSError:
        return None


def read_dump(path: str, fmt: str) -> RankDump:
    """One rank's dump, condensed to what a diagnosis needs (the parsed file is dropped)."""
    try:
        with open(path, "rb") as fh:
            limits.file_size(fh.fileno(), path, "a Flight Recorder dump")  # before reading
            data = fh.read()
            mtime_ns = os.fstat(fh.fileno()).st_mtime_ns
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})", path=path) from None
    with gc_paused():
        doc = parse(data, fmt, path)
        del data
        try:
            dump = read_rank(doc, rank_of(path), path, fmt, mtime_ns)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. an int of 5,000 digits
            raise BadInput(f"{path}: malformed Flight Recorder dump ({exc})", path=path) from None
        del doc  # freed before the collector resumes, so it never scans the dump
    return dump


def load_flight_recorder(
    paths: Sequence[str], job: str | None = None, world_size: int | None = None
) -> list[RankSnapshot] | None:
    """PyTorch Flight Recorder dumps among ``paths`` as cclctl snapshots, one per file, in
    rank order; None when there is no such dump. Other files among ``paths`` are not read.

    ``job`` names the job in the snapshots (default: the folder the dumps are in).
    ``world_size`` when known; else the largest group or rank seen. Raises BadInput naming
    the file for a dump that cannot be used.
    """
    files = find_dumps(paths)
    return None if files is None else read_flight_recorder(files, job, world_size)


def read_flight_recorder(
    files: Sequence[tuple[str, str]], job: str | None = None, world_size: int | None = None
) -> list[RankSnapshot]:
    """The snapshots of these Flight Recorder dumps ((path, format), as :func:`find_dumps`
    gives them); see :func:`load_flight_recorder`."""
    dumps = read_all(files, read_dump)
    if job is None:
        folders = sorted({os.path.basename(os.path.dirname(os.path.abspath(p))) for p, _ in files})
        job = folders[0] if len(folders) == 1 else "pytorch"
    return snapshots(dumps, job, world_size)
