"""``cclctl run --backend``'s choice (``CCLCTL_TORCH_BACKEND``): which groups it moves onto
the ``cclctl`` backend, the errors for a name it cannot move onto, and the helper wrap that
rewrites a group's backend, on torch's own helper signature (no job: fast).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cclctl.commands.run import check_backend
from cclctl.errors import ConfigError
from cclctl.integrations.torch import backend_choice
from cclctl.integrations.torch.backend_choice import from_env, moved, parse

CCLCTL = str(Path(sys.executable).with_name("cclctl"))
CPU, BOTH = frozenset({"cpu"}), frozenset({"cpu", "cuda"})


def test_cclctl_is_cpus_groups_and_the_pairs_name_device_types() -> None:
    assert parse("cclctl") == parse("cpu:cclctl") == CPU
    assert parse(" CPU:cclctl,cuda:cclctl ") == BOTH
    assert parse("cuda:cclctl") == frozenset({"cuda"})
    assert from_env({}) == from_env({"CCLCTL_TORCH_BACKEND": " "}) == frozenset()


@pytest.mark.parametrize(
    "raw", ["gloo", "nccl", "cpu:gloo", "xpu:cclctl", "cpu:cclctl,cpu:cclctl", "cclctl,"]
)
def test_a_name_it_cannot_move_onto_is_refused_with_the_choices(raw: str) -> None:
    with pytest.raises(ValueError, match="give cclctl, cpu:cclctl, cuda:cclctl"):
        parse(raw)
    with pytest.raises(ConfigError, match="CCLCTL_TORCH_BACKEND: "):
        from_env({"CCLCTL_TORCH_BACKEND": raw})
    with pytest.raises(ConfigError, match="--backend ") as caught:
        check_backend(raw, {})
    assert caught.value.fields.get("flag") == "--backend"


def test_gloo_groups_move_and_nccl_ones_only_when_cuda_is_asked() -> None:
    assert moved({"cpu": "gloo", "cuda": "gloo"}, CPU)  # init_process_group("gloo")
    assert moved({"cpu": "gloo"}, CPU)  # no backend, on a host without an accelerator
    assert not moved({"cuda": "nccl"}, CPU)  # no backend on a GPU host: NCCL stays
    assert not moved({"cpu": "gloo", "cuda": "nccl"}, CPU)  # moved whole or not at all
    assert moved({"cpu": "gloo", "cuda": "nccl"}, BOTH)
    assert not moved({"cpu": "mpi"}, BOTH) and not moved({"cpu": "gloo"}, frozenset())


def test_run_refuses_an_unknown_backend_before_the_job_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cmd = [CCLCTL, "run", "--backend", "nccl", "--", "touch", str(marker)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and not marker.exists()
    assert "--backend 'nccl' is not a backend cclctl run moves a job onto" in out.stderr


class _C10d:
    """torch's c10d as the wrap sees it: a helper with torch's parameter names."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._new_process_group_helper = self.helper

    def helper(self, group_size: int, group_rank: int, global_ranks_in_group: list[int],
               backend: str, store: object = None) -> str:  # fmt: skip
        self.calls.append(backend)
        return backend

    @staticmethod
    def BackendConfig(backend: str) -> Any:  # torch's name
        maps = {"gloo": {"cpu": "gloo", "cuda": "gloo"}, "undefined": {"cpu": "gloo"},
                "nccl": {"cuda": "nccl"}, "cclctl": {"cpu": "cclctl"},
                "cpu:gloo,cuda:nccl": {"cpu": "gloo", "cuda": "nccl"}}  # fmt: skip

        class Config:
            def get_device_backend_map(self) -> dict[str, str]:
                return maps[backend]

        return Config()


def test_the_world_moves_and_then_its_gloo_subgroups_by_position_or_keyword() -> None:
    c10d = _C10d()
    helper = backend_choice._wrap(c10d, c10d.helper, CPU)
    assert helper(2, 0, [], "undefined") == "cclctl"
    assert helper(2, 0, [0, 1], backend="gloo") == "cclctl"
    assert helper(2, 0, [0, 1], "nccl") == "nccl"


def test_a_subgroup_stays_when_the_world_did_not_move() -> None:
    c10d = _C10d()
    helper = backend_choice._wrap(c10d, c10d.helper, CPU)
    assert helper(2, 0, [], "nccl") == "nccl"  # a GPU job's world
    assert helper(2, 0, [0, 1], "gloo") == "gloo"  # its CPU side group: cclctl needs its world


def test_a_group_the_choice_covers_in_part_stays_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c10d = _C10d()
    helper = backend_choice._wrap(c10d, c10d.helper, CPU)
    with caplog.at_level("WARNING", logger="cclctl.torch"):
        assert helper(2, 0, [], "cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
        assert helper(2, 0, [], "cclctl") == "cclctl"  # the job's own choice: no word
    assert [r.getMessage() for r in caplog.records] == [
        "cclctl: a group on cpu:gloo,cuda:nccl stays there: CCLCTL_TORCH_BACKEND=cpu:cclctl "
        "does not move all of its backends (a group runs on one backend); ask "
        "cpu:cclctl,cuda:cclctl to move NCCL's too"
    ]
    both = backend_choice._wrap(c10d, c10d.helper, BOTH)
    assert both(2, 0, [], "cpu:gloo,cuda:nccl") == "cclctl"
