"""The trace record: one data model for live status, flight-recorder dumps and diagnosis.

Everything cclctl writes is JSON built from these classes, and everything it reads back goes
through the ``from_dict`` functions here, which validate before trusting a field. Standard
library only, so every layer (and tests with record factories) can use it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from cclctl import limits, records_inflight, revocation
from cclctl.call_fault import CallFault, fault_from_dict
from cclctl.comm_info import CommInfo, clip, comms_from_dict
from cclctl.endings import ending_of
from cclctl.errors import BadInput
from cclctl.record_stages import stages_from_dict
from cclctl.revocation import Revocation
from cclctl.slow_signals import Signals, signals_from_dict
from cclctl.stack_records import ThreadStack, stacks_from_list

DUMP_SCHEMA = "cclctl.dump"
STATUS_SCHEMA = "cclctl.status"
#: Version 1 throughout: fields are only ever added (a dump's ``stacks`` is one), and
#: readers ignore the fields they do not know; renaming or removing one needs version 2.
SCHEMA_VERSION = 1

STARTED = "started"
COMPLETED = "completed"
FAILED = "failed"
ABORTED = "aborted"
TIMED_OUT = "timed_out"
STATES = (STARTED, COMPLETED, FAILED, ABORTED, TIMED_OUT)
FINAL_STATES = (COMPLETED, FAILED, ABORTED)


@dataclasses.dataclass(slots=True)
class CollectiveRecord:
    """One collective (or point-to-point) call on one rank.

    ``seq`` is per communicator, starts at 1 and is the same on every rank for the same call;
    point-to-point calls carry ``peer`` and their own per-pair sequence in ``seq``.
    ``start_ns``/``end_ns`` are wall-clock nanoseconds so that ranks can be compared.
    ``waiting_on``/``waiting_for`` are kept current by the algorithms while the call blocks.
    """

    comm: str
    seq: int
    op: str
    dtype: str = ""
    count: int = 0  # elements, as the caller passed them (per rank, like NCCL's count)
    nbytes: int = 0  # bytes as nccl-tests sizes them: all_gather/reduce_scatter = full buffer
    root: int | None = None
    peer: int | None = None
    epoch: int = 0  # the communicator's epoch the call ran in (a retry runs in a later one)
    algo: str = ""
    state: str = STARTED
    start_ns: int = 0
    end_ns: int = 0
    step: int = 0
    steps: int = 0
    waiting_on: int | None = None
    waiting_for: str | None = None  # "send" or "recv"
    error: str | None = None
    pg_name: str = ""  # a torch job's process group name, as PyTorch's Flight Recorder has it
    torch_seq: int | None = None  # the backend's own seq (Flight Recorder's collective_seq_id)
    attempt: int = 1  # 1 for a seq's first run, 2 for its first retry, ... (see ``epoch``)
    #: how a failed call failed, as fields (see :mod:`cclctl.call_fault`); None while it
    #: has not failed, and in documents written before the field existed
    fault: CallFault | None = None
    #: a relayed call's nanoseconds per stage (``d2h``, ``collective``, ``h2d``: see
    #: :mod:`cclctl.runtime.relay`); empty for every other call, and then left out of the JSON
    stages: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON; ``fault`` and ``stages`` only where there are some (older
        readers skip them)."""
        doc = dataclasses.asdict(self)
        del doc["fault"]
        if self.fault is not None:
            doc["fault"] = self.fault.to_dict()
        if not self.stages:
            del doc["stages"]
        return doc

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns if self.end_ns else 0


_RECORD_FIELDS = {f.name: f for f in dataclasses.fields(CollectiveRecord)}
_INT_FIELDS = ("seq", "count", "nbytes", "epoch", "attempt", "start_ns", "end_ns", "step", "steps")
_OPTIONAL_INT_FIELDS = ("root", "peer", "waiting_on", "torch_seq")
_STR_FIELDS = ("comm", "op", "dtype", "algo", "state", "pg_name")


def _fail(where: str, why: str) -> BadInput:
    return BadInput(f"{where}: {why}", where=where)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def record_from_dict(data: object, where: str = "record") -> CollectiveRecord:
    """Validate and build a record; unknown keys are ignored (newer writers may add some)."""
    if not isinstance(data, Mapping):
        raise _fail(where, f"expected an object, got {type(data).__name__}")
    for key in ("comm", "seq", "op"):
        if key not in data:
            raise _fail(where, f"missing field {key!r}")
    kwargs: dict[str, Any] = {}
    for name in _RECORD_FIELDS:
        if name not in data:
            continue
        if name == "fault":
            fault = data[name]
            kwargs[name] = None if fault is None else fault_from_dict(fault, f"{where}: fault")
            continue
        if name == "stages":
            kwargs[name] = stages_from_dict(data[name], where)
            continue
        value = data[name]
        if name in _INT_FIELDS and not _is_int(value):
            raise _fail(where, f"field {name!r} must be an integer, got {clip(repr(value))}")
        if name in _OPTIONAL_INT_FIELDS and value is not None and not _is_int(value):
            raise _fail(where, f"field {name!r} must be an integer or null, got {value!r}")
        if _is_int(value) and not -limits.MAX_INT <= value <= limits.MAX_INT:
            raise _fail(where, f"field {name!r} does not fit 64 bits ({len(str(value))} digits)")
        if name in _STR_FIELDS and not isinstance(value, str):
            raise _fail(where, f"field {name!r} must be a string, got {value!r}")
        kwargs[name] = value
    if kwargs.get("attempt", 1) < 1:
        raise _fail(where, f"field 'attempt' must be 1 or more, got {kwargs['attempt']!r}")
    if kwargs.get("state", STARTED) not in STATES:
        raise _fail(where, f"unknown state {kwargs['state']!r}")
    return CollectiveRecord(**kwargs)


@dataclasses.dataclass(slots=True)
class RankSnapshot:
    """A rank's state as written to a dump file (``kind="dump"``) or published live
    (``kind="status"``): identity, per-communicator progress and its recent records.

    A status carries the in-flight record, counters and the heartbeat; a dump carries the
    ring of recent records, why it was written and the Python stack of each thread (see
    :mod:`cclctl.stack_records`; older dumps have none). Both are one JSON document.
    """

    kind: str  # "dump" or "status"
    job: str
    rank: int
    world_size: int
    host: str
    pid: int
    time_ns: int
    comms: dict[str, CommInfo] = dataclasses.field(default_factory=dict)
    records: list[CollectiveRecord] = dataclasses.field(default_factory=list)
    inflight: CollectiveRecord | None = None
    reason: str = ""
    counters: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics_url: str = ""
    stacks: list[ThreadStack] = dataclasses.field(default_factory=list)
    #: the job's failure as this rank adopted it (its origin), None while all is well
    revoke: Revocation | None = None
    #: True in the final status of a rank that closed its communicator and exited cleanly
    finished: bool = False
    #: the rank's slowness signals (see :mod:`cclctl.slow_signals`); None where none were kept
    signals: Signals | None = None
    #: how its process ended other than cleanly (:mod:`cclctl.endings`; ``reason`` says it
    #: in words), "" while it runs or after a clean finish
    ending: str = ""

    @property
    def schema(self) -> str:
        return DUMP_SCHEMA if self.kind == "dump" else STATUS_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """The document; ``stacks`` comes last, after the records (a reader's fast path
        finds the records array by the ``counters`` key that follows it)."""
        doc = {
            "schema": self.schema,
            "version": SCHEMA_VERSION,
            "job": self.job,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "pid": self.pid,
            "time_ns": self.time_ns,
            "reason": self.reason,
            "comms": {k: v.to_dict() for k, v in self.comms.items()},
            "inflight": self.inflight.to_dict() if self.inflight else None,
            "records": [r.to_dict() for r in self.records],
            "counters": self.counters,
            "metrics_url": self.metrics_url,
        }
        if self.revoke is not None:
            doc["revoke"] = self.revoke.to_dict()
        if self.finished:
            doc["finished"] = True
        if self.ending:
            doc["ending"] = self.ending
        if self.signals is not None:
            doc["signals"] = self.signals.to_dict()
        if self.stacks or self.kind == "dump":
            doc["stacks"] = [s.to_dict() for s in self.stacks]
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


def snapshot_from_dict(data: object, where: str = "document") -> RankSnapshot:
    """Validate a dump or status document (as parsed JSON) and build a snapshot."""
    if not isinstance(data, Mapping):
        raise _fail(where, f"expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema not in (DUMP_SCHEMA, STATUS_SCHEMA):
        raise _fail(where, f"not a cclctl dump or status (schema is {schema!r})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > SCHEMA_VERSION:
        raise _fail(where, f"unsupported {schema} version {version!r}")
    for key in ("rank", "world_size", "pid", "time_ns"):
        if not _is_int(data.get(key)):
            raise _fail(where, f"field {key!r} must be an integer")
        if not -limits.MAX_INT <= data[key] <= limits.MAX_INT:
            raise _fail(where, f"field {key!r} does not fit 64 bits ({len(str(data[key]))} digits)")
    rank, world_size = int(data["rank"]), limits.world_size(int(data["world_size"]), where)
    if not 0 <= rank < max(1, world_size):
        raise _fail(where, f"rank {rank} is outside world size {world_size}")
    records_raw = data.get("records", [])
    if not isinstance(records_raw, list):
        raise _fail(where, "field 'records' must be a list")
    inflight_raw = data.get("inflight")
    counters = data.get("counters") or {}
    if not isinstance(counters, Mapping):
        raise _fail(where, "field 'counters' must be an object")
    comms = comms_from_dict(data.get("comms", {}), where)
    records = [record_from_dict(r, f"{where}: record {i}") for i, r in enumerate(records_raw)]
    return RankSnapshot(
        kind="dump" if schema == DUMP_SCHEMA else "status",
        job=str(data.get("job", "")),
        rank=data["rank"],
        world_size=data["world_size"],
        host=str(data.get("host", "")),
        pid=data["pid"],
        time_ns=data["time_ns"],
        comms=comms,
        records=records,
        inflight=records_inflight.inflight(
            inflight_raw,
            records_raw,
            records,
            lambda raw: record_from_dict(raw, f"{where}: inflight"),
        ),
        reason=str(data.get("reason", "")),
        counters=dict(counters),
        metrics_url=str(data.get("metrics_url", "")),
        stacks=stacks_from_list(data.get("stacks"), where),
        revoke=_revoke(data.get("revoke"), world_size, f"{where}: revoke"),
        finished=data.get("finished") is True,
        signals=None
        if data.get("signals") is None
        else signals_from_dict(data["signals"], f"{where}: signals"),
        ending=_ending(data, where),
    )


def _ending(data: Mapping[str, Any], where: str) -> str:
    if "ending" not in data:
        return ending_of(str(data.get("reason", "")))
    if not isinstance(data["ending"], str):
        raise _fail(where, f"field 'ending' must be a string, got {data['ending']!r}")
    return data["ending"]


def _revoke(data: object, world_size: int, where: str) -> Revocation | None:
    """The document's revoke record, whose ranks must be of this job (or the operator)."""
    if data is None:
        return None
    record = revocation.from_dict(data, where)
    for name in ("origin", "seen_by", "peer"):
        value = getattr(record, name)
        if value is not None and value >= world_size:
            raise _fail(where, f"field {name!r} is rank {value}, outside world size {world_size}")
    return record


def snapshot_from_json(text: str | bytes, where: str = "document") -> RankSnapshot:
    """Parse JSON text defensively: anything unusable becomes :class:`BadInput`."""
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(where, f"not valid JSON ({exc})") from None
    except RecursionError:
        raise _fail(where, "JSON nested too deeply") from None
    return snapshot_from_dict(data, where)
