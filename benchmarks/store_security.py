"""What the store's token and limits cost, and what they bound (prints; asserts nothing).

1. Connecting a client and its first answer (a ``list``): without a token, and with the
   token's handshake (two more round trips, three HMACs); then a ``set`` round trip on an
   open store and after the handshake. The client runs in a child process, as a rank does.
2. The store's memory under half-sent frames, as RSS of a store alone in a process: three
   frames declared at 600 MiB (refused at the header), then five 63 MiB parts of frames under
   the default 64 MiB cap (held until the 4 x 64 MiB budget for partial frames is spent).

    python benchmarks/store_security.py [--connects N]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

import psutil

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "support"))
from store_attacks import closed_by_peer, connect, declared_frame_head, send_until_closed

from cclctl.store.client import StoreServer

MiB = 1 << 20
TOKEN = "benchmark-token"

CLIENT = r"""
import statistics, sys, time
from cclctl.store.client import StoreClient
port, token, n, may_set = int(sys.argv[1]), sys.argv[2] or None, int(sys.argv[3]), sys.argv[4]
def median_us(op):
    samples = []
    for _ in range(n):
        t = time.perf_counter(); op(); samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6
def first_answer():
    with StoreClient("127.0.0.1", port, token=token) as c:
        c.list("none/")
c = StoreClient("127.0.0.1", port, token=token)
set_us = median_us(lambda: c.set("k", b"v" * 64)) if may_set == "1" else 0.0
print(f"{median_us(first_answer):.1f} {set_us:.1f}")
"""


def client_costs(port: int, token: str, n: int, may_set: bool) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, str(port), token, str(n), "1" if may_set else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    connect_us, set_us = out.stdout.split()
    return float(connect_us), float(set_us)


def handshake(n: int) -> None:
    with StoreServer(token=TOKEN) as tokened, StoreServer() as open_store:
        stranger = client_costs(tokened.port, "", n, may_set=False)
        proved = client_costs(tokened.port, TOKEN, n, may_set=True)
        open_set = client_costs(open_store.port, "", n, may_set=True)[1]
    print(f"connect + first list, no token        median {stranger[0]:8.1f} us")
    print(f"connect + handshake + first list      median {proved[0]:8.1f} us")
    print(f"set round trip, open store            median {open_set:8.1f} us")
    print(f"set round trip, after the handshake   median {proved[1]:8.1f} us")


STORE = r"""
import json, os, sys
from cclctl.store.client import StoreServer
with StoreServer() as server:
    print(json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(server.rejected), flush=True)
"""


def memory(label: str, clients: int, declared: int, sent: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", STORE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    store = psutil.Process(info["pid"])
    try:
        before = store.memory_info().rss
        socks = [connect(info["port"]) for _ in range(clients)]
        for sock in socks:
            sock.settimeout(0.5)
            send_until_closed(sock, declared_frame_head(declared), sent)
        time.sleep(1.0)  # let the store read what the kernel buffered
        peak = store.memory_info().rss
        proc.stdin.write("stats\n")
        proc.stdin.flush()
        rejected = {k: v for k, v in json.loads(proc.stdout.readline()).items() if v}
        closed = sum(closed_by_peer(sock, 0.5) for sock in socks)
        print(
            f"{label:<44} RSS {before / MiB:6.1f} -> {peak / MiB:6.1f} MiB "
            f"(+{(peak - before) / MiB:.1f}); closed {closed}/{clients} {rejected}"
        )
        for sock in socks:
            sock.close()
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connects", type=int, default=300)
    args = parser.parse_args()
    handshake(args.connects)
    memory("3 half frames declared at 600 MiB", 3, 600 * MiB, 300 * MiB)
    memory("5 x 63 MiB of 64 MiB frames (default cap)", 5, 64 * MiB - 64, 63 * MiB)


if __name__ == "__main__":
    main()
