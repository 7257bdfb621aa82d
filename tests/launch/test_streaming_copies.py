"""The streaming-copy threshold the launcher hands its ranks through GLIBC_TUNABLES."""

from __future__ import annotations

import os
import subprocess

import pytest
from launch_helpers import PY, Lines

from cclctl.errors import ConfigError
from cclctl.launch import streaming_copies as sc
from cclctl.launch.launcher import launch

LD_SO = "/lib64/ld-linux-x86-64.so.2"


def test_the_default_threshold_is_added_to_the_tunables() -> None:
    env = sc.rank_environment({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": f"{sc.TUNABLE}={32 << 20}"}


def test_other_tunables_are_kept_and_sizes_take_units() -> None:
    env = sc.rank_environment({"GLIBC_TUNABLES": "glibc.malloc.check=0", sc.VARIABLE: "64M"})
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.check=0:{sc.TUNABLE}={64 << 20}"


def test_a_threshold_the_user_gave_glibc_wins() -> None:
    mine = f"{sc.TUNABLE}=1048576"
    assert sc.rank_environment({"GLIBC_TUNABLES": mine})["GLIBC_TUNABLES"] == mine


@pytest.mark.parametrize("off", ["0", "off", "OFF"])
def test_zero_or_off_leaves_glibc_alone(off: str) -> None:
    assert "GLIBC_TUNABLES" not in sc.rank_environment({sc.VARIABLE: off})


@pytest.mark.parametrize("bad", ["fast", "-1M", "3", "1K", "1.5.2M"])
def test_a_bad_threshold_names_the_variable(bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"{sc.VARIABLE}='{bad}' is not valid"):
        sc.threshold({sc.VARIABLE: bad})


@pytest.mark.skipif(not os.path.exists(LD_SO), reason="needs glibc's x86-64 dynamic loader")
@pytest.mark.timeout(30)
def test_launched_ranks_run_with_the_threshold_glibc_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """glibc itself, in a launched rank, reports the threshold as in force (it silently
    keeps its default for values it refuses)."""
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setenv(sc.VARIABLE, "48M")
    program = (
        "import subprocess\n"
        f"out = subprocess.run([{LD_SO!r}, '--list-tunables'], capture_output=True, text=True)\n"
        f"print([l for l in out.stdout.splitlines() if l.startswith({sc.TUNABLE!r})][0])\n"
    )
    lines = Lines()
    assert launch([PY, "-c", program], 2, output=lines).returncode == 0
    seen = sorted(line for _, stream, line in lines.items if stream == "stdout")
    assert len(seen) == 2
    assert all(line.startswith(f"{sc.TUNABLE}: {hex(48 << 20)} ") for line in seen), seen


def test_the_cli_refuses_a_bad_threshold_before_starting_ranks() -> None:
    proc = subprocess.run(
        [PY, "-m", "cclctl", "launch", "-n", "1", "--", "true"],
        env={**os.environ, sc.VARIABLE: "lots"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert f"{sc.VARIABLE}='lots' is not valid" in proc.stderr
    assert "Traceback" not in proc.stderr
