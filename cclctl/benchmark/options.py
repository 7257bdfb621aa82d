"""`cclctl bench` options: parsed and checked once, then handed to every rank as JSON.

Every bad value is rejected here, before any rank starts, with a one-line message that names
the flag (exit code 2). The same frozen object travels to spawned ranks as a JSON argument,
so the parent and the ranks cannot disagree about what runs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cclctl.benchmark.catalog import (
    BACKENDS,
    REDOPS,
    REDUCING_OPS,
    DType,
    is_collective,
    normalize_op,
    resolve_dtype,
)
from cclctl.benchmark.sizes import parse_size, size_sweep
from cclctl.config import STAGE_POLICIES, runtime_from_env
from cclctl.errors import BadInput, ConfigError

DEFAULT_MINBYTES = 8
DEFAULT_MAXBYTES = 64 << 20
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
#: Auto iteration counts move at most this many bytes per rank per timed loop, so big sizes
#: run a few iterations and the default 8 B..64 MiB sweep stays within seconds.
ITER_BUDGET_BYTES = 32 << 20
#: nccl-tests' -a: how the ranks' times combine into the row's time (its default is 1).
AVERAGE_MODES = {0: "rank 0", 1: "avg", 2: "min", 3: "max"}
#: The backends whose calls cclctl's runtime runs, where ``--stage`` (CCLCTL_STAGE) applies.
STAGING_BACKENDS = ("cclctl", "torch-cclctl")


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """One benchmark run. ``iters``/``warmup_iters`` of None mean "auto" (see iters_for)."""

    ops: tuple[str, ...] = ("all_reduce",)
    minbytes: int = DEFAULT_MINBYTES
    maxbytes: int = DEFAULT_MAXBYTES
    stepfactor: int = 2
    warmup_iters: int | None = None
    iters: int | None = None
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    check: bool = True
    min_busbw: float | None = None
    command: tuple[str, ...] = ()
    backend: str = "cclctl"  # or torch.distributed's: torch (auto), gloo, nccl
    shared_buffers: bool = False  # buffers from comm.empty(): zero-copy on one host
    average: int = 1  # nccl-tests' -a, see AVERAGE_MODES
    timeout_s: float | None = None  # per collective; None: the runtime's (CCLCTL_TIMEOUT)
    stage: str = "auto"  # CCLCTL_STAGE of the ranks: "always" relays the calls (--stage)

    def __post_init__(self) -> None:
        if not self.ops:
            raise ConfigError("--collective needs at least one collective", flag="--collective")
        size_sweep(self.minbytes, self.maxbytes, self.stepfactor)  # raises on bad bounds
        if self.iters is not None and self.iters < 1:
            raise ConfigError(f"-n/--iters {self.iters} must be at least 1", flag="--iters")
        if self.warmup_iters is not None and self.warmup_iters < 0:
            raise ConfigError(
                f"-w/--warmup_iters {self.warmup_iters} must not be negative",
                flag="--warmup_iters",
            )
        if self.redop not in REDOPS:
            raise ConfigError(
                f"-o/--op {self.redop!r} is not a reduction; choose from {', '.join(REDOPS)}",
                flag="--op",
            )
        if self.average not in AVERAGE_MODES:
            modes = ", ".join(f"{k} ({v})" for k, v in AVERAGE_MODES.items())
            raise ConfigError(
                f"-a/--average {self.average} is not one of {modes}", flag="--average"
            )
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(
                f"-T/--timeout {self.timeout_s:g} must be a positive number of seconds",
                flag="--timeout",
            )
        if self.root < 0:
            raise ConfigError(f"--root {self.root} must not be negative", flag="--root")
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"--backend {self.backend!r} is not one of {', '.join(BACKENDS)}", flag="--backend"
            )
        if self.shared_buffers and self.backend != "cclctl":
            raise ConfigError(
                f"--shared-buffers needs --backend cclctl (torch allocates {self.backend}'s "
                "buffers itself)",
                flag="--shared-buffers",
            )
        if self.stage not in STAGE_POLICIES:
            raise ConfigError(
                f"--stage {self.stage!r} is not one of {', '.join(STAGE_POLICIES)}",
                flag="--stage",
            )
        if self.min_busbw is not None and not self.min_busbw >= 0:
            raise ConfigError(
                f"--min-busbw {self.min_busbw} must be a bandwidth >= 0 (GB/s)", flag="--min-busbw"
            )

    @property
    def staged(self) -> bool:
        """Whether the sweep relays its calls and reports their stages: cclctl's runtime
        under ``CCLCTL_STAGE=always`` (torch-cclctl's backend relays them inside, unseen)."""
        return self.backend == "cclctl" and self.stage == "always"

    @property
    def dtype_info(self) -> DType:
        return resolve_dtype(self.dtype)

    def sizes(self) -> list[int]:
        """The requested byte sizes, before each op rounds them (see sizes.shape_for)."""
        return size_sweep(self.minbytes, self.maxbytes, self.stepfactor)

    def iters_for(self, nbytes: int) -> int:
        """Timed iterations at ``nbytes``: as given, else 20 scaled down for big sizes."""
        if self.iters is not None:
            return self.iters
        return max(1, min(DEFAULT_ITERS, ITER_BUDGET_BYTES // max(nbytes, 1)))

    def warmup_for(self, nbytes: int) -> int:
        """Untimed iterations before timing at ``nbytes``: as given, else up to 5."""
        if self.warmup_iters is not None:
            return self.warmup_iters
        return min(DEFAULT_WARMUP, max(1, self.iters_for(nbytes) // 4))

    def check_world(self, world_size: int) -> None:
        """Checks that need the world size: at least one rank, and the root among them."""
        if world_size < 1:
            raise ConfigError(f"-g/--nranks {world_size} must be at least 1", flag="--nranks")
        if self.root >= world_size and any(op in ("broadcast", "reduce") for op in self.ops):
            raise ConfigError(
                f"--root {self.root} is out of range for {world_size} ranks (0..{world_size - 1})",
                flag="--root",
            )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ops"] = list(self.ops)
        data["command"] = list(self.command)
        if self.stage == "auto":  # the default stages nothing the sweep allocates: unsaid
            del data["stage"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> BenchOptions:
        """Options written by :meth:`to_json` (the spawned ranks' argument)."""
        try:
            data = json.loads(text)
            if not isinstance(data, Mapping):
                raise TypeError("not a JSON object")
            fields = {f.name for f in dataclasses.fields(cls)}
            unknown = set(data) - fields
            if unknown:
                raise KeyError(f"unknown options {sorted(unknown)}")
            given = dict(data)
            for key in ("ops", "command"):
                if key in given:
                    given[key] = tuple(str(item) for item in given[key])
            return cls(**given)
        except (ValueError, TypeError, KeyError) as exc:
            raise BadInput(f"bench options are malformed: {exc}", where="bench options") from None


def parse_ops(text: str) -> tuple[str, ...]:
    """``--collective`` as one name or a comma list; duplicates are dropped, order kept."""
    names = [part for part in text.split(",") if part.strip()]
    if not names:
        raise ConfigError(f"--collective {text!r} names no collective", flag="--collective")
    return tuple(dict.fromkeys(normalize_op(name) for name in names))


def parse_redop(text: str | None, ops: Sequence[str]) -> str:
    """``-o/--op``: the reduction, as in nccl-tests; a collective's name there is the old
    ``--op all_reduce`` spelling, answered with the flag that selects collectives now."""
    if text is None:
        return "sum"
    redop = text.strip().lower()
    if redop not in REDOPS and is_collective(redop):
        raise ConfigError(
            f"-o/--op is the reduction ({', '.join(REDOPS)}), as in nccl-tests; "
            f"choose collectives with --collective {text.strip()}",
            flag="--op",
        )
    plain = [name for name in ops if name not in REDUCING_OPS]
    if plain:
        raise ConfigError(
            f"-o/--op applies to reducing collectives only "
            f"({', '.join(sorted(REDUCING_OPS))}); {plain[0]} does not reduce",
            flag="--op",
        )
    return redop


def build_options(
    *,
    collective: str = "all_reduce",
    minbytes: str = str(DEFAULT_MINBYTES),
    maxbytes: str = "64M",
    stepfactor: int = 2,
    warmup_iters: int | None = None,
    iters: int | None = None,
    dtype: str = "float32",
    redop: str | None = None,
    root: int = 0,
    check: int = 1,
    min_busbw: float | None = None,
    command: Sequence[str] = (),
    backend: str = "cclctl",
    shared_buffers: bool = False,
    average: int = 1,
    timeout_s: float | None = None,
    stage: str | None = None,
) -> BenchOptions:
    """Turn the command line's raw values into BenchOptions, naming the flag on any error."""
    ops = parse_ops(collective)
    redop = parse_redop(redop, ops)
    if check not in (0, 1):
        raise ConfigError(f"-c/--check {check} must be 0 or 1", flag="--check")
    return BenchOptions(
        ops=ops,
        minbytes=parse_size(minbytes, "-b/--minbytes"),
        maxbytes=parse_size(maxbytes, "-e/--maxbytes"),
        stepfactor=stepfactor,
        warmup_iters=warmup_iters,
        iters=iters,
        dtype=resolve_dtype(dtype).name,
        redop=redop,
        root=root,
        check=bool(check),
        min_busbw=min_busbw,
        command=tuple(command),
        backend=backend,
        shared_buffers=shared_buffers,
        average=average,
        timeout_s=timeout_s,
        stage=parse_stage(stage, backend),
    )


def parse_stage(text: str | None, backend: str) -> str:
    """``--stage``, else the ranks' CCLCTL_STAGE; the flag only where cclctl's runtime runs
    the calls (gloo and NCCL have no relay to set)."""
    if text is None:
        return runtime_from_env().stage
    stage = text.strip().lower()
    if stage not in STAGE_POLICIES:
        raise ConfigError(
            f"--stage {text.strip()!r} is not one of {', '.join(STAGE_POLICIES)}", flag="--stage"
        )
    if backend not in STAGING_BACKENDS:
        raise ConfigError(
            f"--stage applies to --backend {' or '.join(STAGING_BACKENDS)}, not {backend}",
            flag="--stage",
        )
    return stage
