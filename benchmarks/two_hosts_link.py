"""The link limit between two namespace hosts: plain socket streams, and iperf3 if present.

What cclctl and gloo are judged against in ``two_hosts.py``: GB/s one way on one stream and
on two, and per direction with one stream each way at once (what a collective that sends
and receives together can get). Each stream is a Python process that sends a fixed number
of bytes from one 4 MiB buffer (``sendall``), read with ``recv_into`` on the other side;
the rate is the bytes over the span from the first stream's start to the last one's end
(both namespaces share the kernel's clock).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

#: How a command runs on a host: (host, *argv) -> the argv that runs it in its namespace.
ExecIn = Callable[..., list[str]]

_RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print('ready', flush=True)
c, _ = s.accept(); buf = bytearray(4 << 20); got = 0; t0 = time.time()
while (k := c.recv_into(buf)): got += k
print(got, t0, time.time(), flush=True)
"""
_SENDER = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
buf = memoryview(bytearray(4 << 20)); left = int(sys.argv[3])
while left > 0: n = min(left, len(buf)); c.sendall(buf[:n]); left -= n
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
"""


def streams(
    exec_in: ExecIn, addrs: dict[str, str], flows: list[tuple[str, str]], nbytes: int, port: int
) -> float:
    """GB/s per direction of ``flows`` (``(from_host, to_host)`` each, run at once)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for i, (_, dst) in enumerate(flows):
            cmd = exec_in(dst, sys.executable, "-c", _RECEIVER, addrs[dst], str(port + i))
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
            ready = procs[-1].stdout
            assert ready is not None and ready.readline().strip() == "ready"
        receivers = list(procs)
        for i, (src, dst) in enumerate(flows):
            args = (addrs[dst], str(port + i), str(nbytes))
            cmd = exec_in(src, sys.executable, "-c", _SENDER, *args)
            procs.append(subprocess.Popen(cmd, text=True))
        spans = [proc.communicate(timeout=120)[0].split() for proc in receivers]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    total = sum(int(s[0]) for s in spans)
    seconds = max(float(s[2]) for s in spans) - min(float(s[1]) for s in spans)
    directions = len({f for f in flows})
    return total / directions / seconds / 1e9 if seconds > 0 else 0.0


def iperf3(exec_in: ExecIn, addrs: dict[str, str], port: int, parallel: int = 1) -> float | None:
    """iperf3's GB/s from h1 to h2 over 3 s (None where iperf3 is not installed)."""
    if not shutil.which("iperf3"):
        return None
    server = subprocess.Popen(
        exec_in("h2", "iperf3", "-s", "-1", "-B", addrs["h2"], "-p", str(port)),
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):  # until the server listens
            out = subprocess.run(
                exec_in(
                    "h1",
                    "iperf3",
                    "-c",
                    addrs["h2"],
                    "-p",
                    str(port),
                    "-t",
                    "3",
                    "-P",
                    str(parallel),
                    "-J",
                ),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            end = json.loads(out.stdout or "{}").get("end", {})
            received = end.get("sum_received") or end.get("sum")
            if out.returncode == 0 and received:
                return float(received["bits_per_second"]) / 8e9
            time.sleep(0.1)
        return None
    finally:
        server.kill()
        server.wait()


def link_limits(
    exec_in: ExecIn, addrs: dict[str, str], port: int, nbytes: int = 2 << 30
) -> dict[str, float | None]:
    """Every figure of the link, GB/s per direction."""
    one, two = [("h1", "h2")], [("h1", "h2"), ("h1", "h2")]
    both, both2 = [("h1", "h2"), ("h2", "h1")], [("h1", "h2"), ("h2", "h1")] * 2
    return {
        "one_way_1_stream": streams(exec_in, addrs, one, nbytes, port),
        "one_way_2_streams": streams(exec_in, addrs, two, nbytes // 2, port + 10),
        "both_ways_1_stream_each": streams(exec_in, addrs, both, nbytes, port + 20),
        "both_ways_2_streams_each": streams(exec_in, addrs, both2, nbytes // 2, port + 30),
        "iperf3_one_way": iperf3(exec_in, addrs, port + 40),
    }
