"""Dumps carry every thread's Python stack: taken by the dumping thread, bounded in threads,
frames and text, validated when read back, and optional (older dumps load without one)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cclctl.errors import BadInput
from cclctl.records import snapshot_from_json
from cclctl.stack_records import MAX_CODE, MAX_FRAMES, MAX_THREADS, stacks_from_list
from cclctl.telemetry.stack_capture import capture_stacks


def _recurse(depth: int, release: threading.Event, ready: threading.Event) -> None:
    if depth:
        _recurse(depth - 1, release, ready)
    else:
        ready.set()
        release.wait(60)


@pytest.fixture
def parked() -> Iterator[threading.Event]:
    """Threads parked in known places until the test ends: many shallow, one very deep."""
    release = threading.Event()
    readies: list[threading.Event] = []
    threads = []
    for i in range(MAX_THREADS + 5):
        ready = threading.Event()
        depth = MAX_FRAMES * 3 if i == 0 else 2
        t = threading.Thread(target=_recurse, args=(depth, release, ready), name=f"parked-{i:02}")
        t.start()
        threads.append(t)
        readies.append(ready)
    for ready in readies:
        assert ready.wait(30)
    yield release
    release.set()
    for t in threads:
        t.join(30)


def test_capture_is_bounded_and_keeps_the_innermost_frames(parked: threading.Event):
    stacks = capture_stacks()
    assert len(stacks) == MAX_THREADS
    assert stacks[0].main and stacks[0].name == "MainThread"
    assert any(f.func.endswith("test_capture_is_bounded_and_keeps_the_innermost_frames")
               for f in stacks[0].frames)  # fmt: skip
    deep = next(s for s in stacks if s.name == "parked-00")
    assert len(deep.frames) == MAX_FRAMES and deep.omitted > 0
    assert [f.func for f in deep.frames[-3:]] == ["_recurse", "Event.wait", "Condition.wait"]
    assert deep.frames[-3].code == "release.wait(60)"
    assert all(len(f.code) <= MAX_CODE for s in stacks for f in s.frames)


def test_the_dumping_thread_leaves_itself_out():
    out: list[list[str]] = []
    worker = threading.Thread(target=lambda: out.append([s.name for s in capture_stacks()]),
                              name="cclctl-dump")  # fmt: skip
    worker.start()
    worker.join(30)
    assert "MainThread" in out[0] and "cclctl-dump" not in out[0]


def test_dump_round_trips_its_stacks(make_tel, tmp_path: Path):
    tel = make_tel(trace_dir=str(tmp_path))
    path = tel.dump("asked")
    assert path is not None
    snap = snapshot_from_json(Path(path).read_text(), where=path)
    main = snap.stacks[0]
    assert main.main and main.frames[-1].file.endswith("stack_capture.py")  # the dump's own caller
    assert any(f.func == "test_dump_round_trips_its_stacks" for f in main.frames)
    status = tel.snapshot("status")
    assert status.stacks == [] and "stacks" not in status.to_dict()  # statuses stay small


def test_an_older_dump_without_stacks_still_loads(make_tel, tmp_path: Path):
    doc = make_tel().snapshot("dump", "old").to_dict()
    del doc["stacks"]
    assert snapshot_from_json(json.dumps(doc)).stacks == []


@pytest.mark.parametrize(
    ("stacks", "why"),
    [
        ({"name": "x"}, "must be a list of at most"),
        ([{"name": "t", "frames": []}] * (MAX_THREADS + 1), "at most 32 threads"),
        ([{"name": "t", "frames": [{"file": "a.py", "line": 1, "func": "f"}] * 49}], "at most 48"),
        ([{"name": "t", "frames": [{"file": "a.py", "line": "1", "func": "f"}]}], "'line'"),
        ([{"name": "t", "frames": [{"file": "a" * 401, "line": 1, "func": "f"}]}], "'file'"),
        ([{"name": "t", "main": "yes", "frames": []}], "'main'"),
    ],
)
def test_stacks_past_the_bounds_or_malformed_are_refused(stacks: object, why: str):
    with pytest.raises(BadInput, match=why) as err:
        stacks_from_list(stacks, "dump.json")
    assert "\n" not in str(err.value)
