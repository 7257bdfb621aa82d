"""Dispatch runs only the algorithms its tables name: an unknown name raises before
anything moves, for every collective; selection's whole choice, zero-copy included, comes
from one call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cclctl.runtime.comm import dispatch, selection
from cclctl.runtime.transport.capabilities import POINT_TO_POINT, Capabilities


def _calls(step: Any, buf: np.ndarray) -> dict[str, Any]:
    caps, bounds = POINT_TO_POINT, [(0, buf.size)]
    return {
        "all_reduce": lambda algo: dispatch.all_reduce(step, algo, caps, buf, buf, "sum"),
        "broadcast": lambda algo: dispatch.broadcast(step, algo, caps, buf, 0),
        "reduce": lambda algo: dispatch.reduce(step, algo, caps, buf, buf, "sum", 0),
        "all_gather": lambda algo: dispatch.all_gather(step, algo, caps, buf, bounds),
        "reduce_scatter": lambda algo: dispatch.reduce_scatter(
            step, algo, caps, buf, buf, bounds, "sum"
        ),
    }


@pytest.mark.parametrize(
    "op", ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"]
)
def test_an_algorithm_the_table_lacks_raises_naming_the_op_and_the_known_ones(op: str) -> None:
    step = SimpleNamespace(size=1, rank=0)  # nothing would move: the name alone fails
    buf = np.zeros(4, np.float32)
    with pytest.raises(dispatch.UnknownAlgorithm, match=rf"{op} has no algorithm 'nope' \(it has"):
        _calls(step, buf)[op]("nope")


def test_selection_decides_zero_copy_with_the_rest_of_the_choice() -> None:
    one_host = Capabilities(one_copy=object())  # type: ignore[arg-type]
    on_shm = selection.decide(selection.parse(""), one_host, 4)
    on_tcp = selection.decide(selection.parse(""), POINT_TO_POINT, 4)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert getattr(on_shm, op).zero_copy_from == selection.ZERO_COPY_MIN_BYTES
        assert getattr(on_tcp, op).zero_copy_from == selection.NEVER
    assert on_shm.reduce.zero_copy_from == on_shm.all_to_all.zero_copy_from == selection.NEVER
