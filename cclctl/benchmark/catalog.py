"""What `cclctl bench` can run: collectives, data types and reduction ops.

Names follow nccl-tests (``alltoall``, ``sendrecv``, type ``float``/``half``) so tables read the
same as theirs; numpy names are accepted too, because that is what our runtime users type.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from cclctl.errors import ConfigError, UsageError

if TYPE_CHECKING:  # numpy is imported once a run needs it: not for every CLI start
    import numpy as np

#: What runs the sweep (`--backend`): cclctl's runtime, or torch.distributed (``torch``: NCCL
#: where CUDA is, else gloo; ``torch-cclctl``: torch.distributed's ``cclctl`` backend, that
#: is cclctl's runtime behind torch's API, named apart from ``cclctl``, the runtime called
#: directly).
BACKENDS = ("cclctl", "torch", "gloo", "nccl", "torch-cclctl")

#: The collectives `cclctl bench --collective` accepts, in nccl-tests' spelling.
OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
)
REDUCING_OPS = frozenset({"all_reduce", "reduce_scatter", "reduce"})
ROOTED_OPS = frozenset({"broadcast", "reduce"})
#: Ops whose buffers split into one chunk per rank, so sizes round to world x itemsize.
CHUNKED_OPS = frozenset({"all_gather", "reduce_scatter", "alltoall"})
REDOPS = ("sum", "prod", "min", "max", "avg")

_OP_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "all_to_all": "alltoall",
    "send_recv": "sendrecv",
}

#: The name bandwidth.bus_factor knows each op by (torch.distributed's).
_BUS_NAMES = {"alltoall": "all_to_all"}


@dataclasses.dataclass(frozen=True)
class DType:
    """A benchmark data type.

    ``exact`` is the largest integer N such that every integer in [-N, N] (or [0, N] when
    unsigned) is representable: inputs are built so every partial result stays within it,
    which makes the expected value exact whatever the reduction order.
    """

    name: str  # numpy's name, what the runtime and JSON metadata use
    nccl_name: str  # nccl-tests' name, what the table's "type" column shows
    itemsize: int
    exact: int
    signed: bool

    def numpy(self) -> np.dtype:
        """The numpy dtype; bfloat16 needs the optional ml_dtypes package."""
        import numpy as np

        if self.name == "bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise UsageError(
                    "--dtype bfloat16 needs the ml_dtypes package (pip install cclctl[bf16])",
                    flag="--dtype",
                ) from None
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.name)


DTYPES = {
    d.name: d
    for d in (
        DType("float32", "float", 4, 2**24, True),
        DType("float16", "half", 2, 2**11, True),
        DType("bfloat16", "bfloat16", 2, 2**8, True),
        DType("float64", "double", 8, 2**53, True),
        DType("int8", "int8", 1, 2**7 - 1, True),
        DType("uint8", "uint8", 1, 2**8 - 1, False),
        DType("int32", "int32", 4, 2**31 - 1, True),
        DType("int64", "int64", 8, 2**63 - 1, True),
    )
}
_DTYPE_ALIASES = {d.nccl_name: d.name for d in DTYPES.values()} | {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "int": "int32",
    "char": "int8",
}


def is_collective(name: str) -> bool:
    """True when ``name`` spells a collective (the old ``--op all_reduce`` habit)."""
    key = name.strip().lower().replace("-", "_")
    return any(_OP_ALIASES.get(part, part) in OPS for part in key.split(",") if part)


def normalize_op(name: str) -> str:
    """Canonical op name for ``name``; raises ConfigError naming ``--collective``."""
    key = name.strip().lower().replace("-", "_")
    key = _OP_ALIASES.get(key, key)
    if key not in OPS:
        raise ConfigError(
            f"--collective {name.strip()!r} is not a collective cclctl bench runs; "
            f"choose from {', '.join(OPS)}",
            flag="--collective",
        )
    return key


def resolve_dtype(name: str) -> DType:
    """The DType for a numpy or nccl-tests type name; raises ConfigError naming ``-d/--dtype``."""
    key = name.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ConfigError(
            f"-d/--dtype {name.strip()!r} is not supported; choose from {', '.join(DTYPES)}",
            flag="--dtype",
        )
    return DTYPES[key]


def bus_name(op: str) -> str:
    """The op's name in :func:`cclctl.bandwidth.bus_factor`."""
    return _BUS_NAMES.get(op, op)
