"""A stalled link is told from a closed window by the sender's TCP_INFO: a receiver that
does not read is a slow or stopped rank (no link fault), dropped packets are a stall.
Each case runs in a network namespace of its own, the drop made by iptables there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = str(Path(__file__).parents[1] / "support" / "stall_probe.py")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"),
    reason="needs root, ip and iptables (network namespaces)",
)


def _probe(how: str) -> dict[str, object]:
    ns = f"stall-{how}-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=20)
        out = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, PROBE, how],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return json.loads(out.stdout)  # type: ignore[no-any-return]
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=20)


@pytest.mark.timeout(90)
def test_a_receiver_that_does_not_read_is_not_a_stalled_link() -> None:
    found = _probe("window")
    assert found["stalled"] is False, found
    assert isinstance(found["last_data_sent_ms"], int) and found["last_data_sent_ms"] >= 3000


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["drop", "blocked"])
def test_lost_packets_and_a_sender_that_cannot_send_are_a_stalled_link(how: str) -> None:
    assert _probe(how)["stalled"] is True
