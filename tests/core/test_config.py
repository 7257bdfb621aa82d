"""Configuration from the environment: every launcher's names, and every bad value's message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cclctl.config import (
    RuntimeConfig,
    in_launched_job,
    rendezvous_from_env,
    runtime_from_env,
)
from cclctl.config_check import VARIABLES, check_option
from cclctl.config_rendezvous import RendezvousConfig
from cclctl.errors import ConfigError
from cclctl.runtime.comm import selection


def test_torchrun_names() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "1234",
    }
    assert rendezvous_from_env(env) == RendezvousConfig(3, 8, 1, 4, "node0", 1234, "torchrun")


def test_under_torchrun_the_store_takes_the_next_port() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"}
    assert rendezvous_from_env(env).store_port == 1235


def test_slurm_names_and_node_list() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "8(x2)",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    cfg = rendezvous_from_env(env)
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.local_world_size) == (5, 16, 1, 8)
    assert (cfg.store_host, cfg.store_port, cfg.source) == ("gpu07", 29500, "slurm")


def test_open_mpi_names() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
    }
    cfg = rendezvous_from_env(env)
    assert (cfg.rank, cfg.world_size, cfg.store_host, cfg.source) == (2, 4, "10.0.0.1", "openmpi")


def test_torchrun_names_win_over_slurm() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "9"}
    assert rendezvous_from_env(env).source == "torchrun"
    assert in_launched_job(env) and not in_launched_job({})


def test_cclctl_store_names_a_running_store() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "CCLCTL_STORE": "10.1.2.3:4000"}
    cfg = rendezvous_from_env(env)
    assert (cfg.store_host, cfg.store_port, cfg.store_external) == ("10.1.2.3", 4000, True)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {},
            "cannot tell this process's rank: set RANK and WORLD_SIZE (with MASTER_ADDR and "
            "MASTER_PORT), or start it with `cclctl launch`, torchrun, srun or mpirun",
        ),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' must not be negative"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is out of range for WORLD_SIZE=2"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "99999"},
            "MASTER_PORT='99999' is not valid: a port is between 0 and 65535",
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "CCLCTL_STORE": "nowhere"},
            "CCLCTL_STORE='nowhere' is not valid: expected HOST:PORT with a port from 1 to 65535",
        ),
    ],
)
def test_bad_rendezvous_variables(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        rendezvous_from_env(env)
    assert str(info.value) == message


def test_runtime_defaults_and_flags_win_over_environment() -> None:
    # a job's ranks use their host's agent; a config built in code (thread ranks) has none
    default = RuntimeConfig(hostname=runtime_from_env({}).hostname, host_agent=True)
    assert runtime_from_env({}) == default and not RuntimeConfig().host_agent
    assert not runtime_from_env({"CCLCTL_HOST_AGENT": "0"}).host_agent
    cfg = runtime_from_env({"CCLCTL_TIMEOUT": "5", "CCLCTL_JOB": "j"}, timeout_s=9.0)
    assert (cfg.timeout_s, cfg.job) == (9.0, "j")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CCLCTL_TIMEOUT": "soon"}, "CCLCTL_TIMEOUT='soon' is not valid"),
        ({"CCLCTL_TIMEOUT": "-1"}, "must be a positive number of seconds"),
        ({"CCLCTL_TRANSPORT": "carrier-pigeon"}, "expected one of auto, tcp"),
        ({"CCLCTL_ON_HANG": "panic"}, "expected one of raise, abort, wait"),
        ({"CCLCTL_ON_FAILURE": "retry"}, "CCLCTL_ON_FAILURE='retry' is not valid: expected one"),
        ({"CCLCTL_RETRY_BUDGET": "-1"}, "CCLCTL_RETRY_BUDGET='-1' is not valid"),
        ({"CCLCTL_TRACE_BUFFER": "-5"}, "CCLCTL_TRACE_BUFFER='-5' is not valid: must be >= 0"),
        ({"CCLCTL_METRICS_PORT": "http"}, "CCLCTL_METRICS_PORT='http' is not valid"),
    ],
)
def test_bad_runtime_variables(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="is not valid") as info:
        runtime_from_env(env)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bogus", "no collective has an algorithm called 'bogus'"),
        ("all_reduce=chain", "all_reduce has no algorithm 'chain' (has rd, ring)"),
        ("gossip=ring", "unknown collective 'gossip'"),
        ("all_reduce>=1M=rd", "a size threshold selects 'ring' for all_reduce"),
    ],
)
def test_bad_algorithm_choices(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        selection.parse(spec)
    assert str(info.value) == f"CCLCTL_ALGO item {spec!r}: {message}"


def test_algorithm_choices() -> None:
    sel = selection.parse("all_reduce=ring, broadcast=tree, reduce>=1M=ring")
    assert sel.choose("all_reduce", 8) == "ring"
    assert sel.choose("broadcast", 1 << 30) == "tree"
    assert sel.choose("reduce", (1 << 20) - 1) == "tree" and sel.choose("reduce", 1 << 20) == "ring"
    default = selection.parse("")
    assert (
        default.choose("all_reduce", 8) == "rd" and default.choose("all_reduce", 1 << 20) == "ring"
    )


@pytest.mark.timeout(60)
def test_a_rank_outside_any_job_gets_one_line_and_exit_2() -> None:
    code = "import cclctl, cclctl.cli, sys\ntry:\n    cclctl.init()\nexcept Exception as e:\n"
    code += "    print(type(e).__name__, e.exit_code, e); sys.exit(0)"
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=50
    )
    assert out.stdout.startswith("ConfigError 2 cannot tell this process's rank")


@pytest.mark.timeout(60)
def test_unreachable_store_is_named_with_its_address() -> None:
    code = (
        "import cclctl\n"
        "try:\n    cclctl.init(rank=0, world_size=2, store='127.0.0.1:1', connect_timeout_s=1.0,"
        " token='a-token-for-this-test-0123456789abcdef')\n"
        "except Exception as e:\n    print(type(e).__name__, e.exit_code, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert out.stdout.startswith("StoreTimeout 1 cannot reach the store at 127.0.0.1:1 after 1")


def test_a_bare_algorithm_name_applies_to_every_collective_that_has_it() -> None:
    sel = selection.parse("ring")
    assert {op: sel.choose(op, 8) for op in ("all_reduce", "reduce", "broadcast")} == {
        "all_reduce": "ring",
        "reduce": "ring",
        "broadcast": "tree",
    }


@pytest.mark.parametrize(
    ("flag", "value", "variable", "raw", "why"),
    [
        ("--timeout", -1.0, "CCLCTL_TIMEOUT", "-1", "must be a positive number of seconds"),
        ("--timeout", float("nan"), "CCLCTL_TIMEOUT", "nan", "expected a positive number"),
        ("--metrics-port", 70000, "CCLCTL_METRICS_PORT", "70000", "a port is between 0 and"),
    ],
)
def test_an_option_and_its_variable_are_held_to_the_same_rule(
    flag: str, value: object, variable: str, raw: str, why: str
) -> None:
    with pytest.raises(ConfigError) as by_flag:
        check_option(flag, value)
    with pytest.raises(ConfigError) as by_variable:
        runtime_from_env({variable: raw})
    assert str(by_flag.value).startswith(f"{flag} ") and why in str(by_flag.value)
    assert str(by_variable.value).startswith(f"{variable}={raw!r} is not valid: ")
    assert why in str(by_variable.value)
    assert by_flag.value.fields == {"flag": flag} and by_variable.value.fields == {
        "variable": variable
    }


def test_every_variable_the_code_reads_is_known_to_the_preflight() -> None:
    """A CCLCTL_* name in cclctl's source that the table misses would be warned as a typo."""
    import pathlib
    import re

    source = pathlib.Path(__file__).parents[1] / "cclctl"
    named = {
        name
        for path in source.rglob("*.py")
        for name in re.findall(r"CCLCTL_[A-Z][A-Z_]*[A-Z]", path.read_text())
    }
    assert named - set(VARIABLES) == set()


def test_retry_budget_is_30_seconds_and_0_turns_it_off() -> None:
    assert runtime_from_env({}).retry_budget_s == 30.0
    assert runtime_from_env({"CCLCTL_RETRY_BUDGET": "0"}).retry_budget_s == 0.0
    assert runtime_from_env({"CCLCTL_RETRY_BUDGET": "2.5"}).retry_budget_s == 2.5


def test_on_failure_is_raise_unless_shrink_is_asked_for() -> None:
    assert runtime_from_env({}).on_failure == "raise"
    assert runtime_from_env({"CCLCTL_ON_FAILURE": "shrink"}).on_failure == "shrink"


def test_slow_window_is_5_seconds_and_bounded() -> None:
    assert runtime_from_env({}).slow_window_s == 5.0
    assert runtime_from_env({"CCLCTL_SLOW_WINDOW": "0.5"}).slow_window_s == 0.5
    for bad in ("0", "-1", "0.01", "7200", "soon"):
        with pytest.raises(ConfigError, match="CCLCTL_SLOW_WINDOW"):
            runtime_from_env({"CCLCTL_SLOW_WINDOW": bad})
