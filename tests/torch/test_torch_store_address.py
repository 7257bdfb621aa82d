"""Where an instrumented torch job finds cclctl's store (cclctl.config.attach_from_env)."""

from __future__ import annotations

import pytest

from cclctl.config import attach_from_env
from cclctl.errors import ConfigError

pytest.importorskip("torch")


def test_the_launcher_s_store_is_joined_as_it_is() -> None:
    env = {"CCLCTL_STORE": "10.0.0.1:7000", "MASTER_PORT": "29500", "RANK": "1",
           "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}  # fmt: skip
    where = attach_from_env(1, 2, env)
    assert where is not None
    assert (where.store_host, where.store_port, where.store_external) == ("10.0.0.1", 7000, True)
    assert (where.rank, where.world_size, where.local_rank) == (1, 2, 1)


@pytest.mark.parametrize("torchrun", [False, True])
def test_otherwise_rank_0_hosts_it_next_to_torch_s_own_store(torchrun: bool) -> None:
    env = {"MASTER_ADDR": "node7", "MASTER_PORT": "29500"}
    if torchrun:  # torch's store is on MASTER_PORT either way: one port up, never two
        env.update(TORCHELASTIC_RUN_ID="job", RANK="3", WORLD_SIZE="4", LOCAL_RANK="3")
    where = attach_from_env(3, 4, env)
    assert where is not None
    assert (where.store_host, where.store_port, where.store_external) == ("node7", 29501, False)
    assert where.local_rank == (3 if torchrun else 0)


def test_no_store_without_either_variable_and_a_clear_error_at_the_last_port() -> None:
    assert attach_from_env(0, 1, {}) is None
    with pytest.raises(ConfigError, match="MASTER_PORT=65535"):
        attach_from_env(0, 1, {"MASTER_PORT": "65535"})
