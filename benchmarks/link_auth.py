"""What authenticated links cost: the handshake, and CCLCTL_LINK_MAC on all_reduce over TCP
(asserts nothing).

    python benchmarks/link_auth.py handshake [--rounds 200]
    python benchmarks/link_auth.py mac [--rounds 20] [--sizes 1048576 67108864] [--json out.json]

``handshake`` links a pair of ranks in one process, over loopback, again and again: the
authenticated link (connect, HELLO, CHALLENGE, PROOF, ACCEPT, as ``Links.get`` does it)
against a bare connect with a 16-byte hello and no proof (what a link was without auth).

``mac`` runs 2 ranks over TCP with ``CCLCTL_LINK_MAC=1`` and takes the MAC sessions off
the links for the "off" side (and its control "off2"), so both sides run on the same links
in the same run, paired round by round (see ``paired.py``): the ratio is the MAC's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from paired import bootstrap_median, render, run_rounds, summarize

#: bytes -> calls per block
SIZES = {1 << 20: 20, 64 << 20: 2}


def _handshakes(rounds: int) -> dict[str, list[float]]:
    from cclctl.runtime.transport import wire
    from cclctl.runtime.transport.base import Wait
    from cclctl.runtime.transport.tcp.links import Links

    call = wire.Call(comm=1, epoch=0, seq=1, op="all_reduce")
    times: dict[str, list[float]] = {"bare": [], "auth": []}
    for _ in range(rounds):
        a = Links(0, 2, "bench", "127.0.0.1", 10.0, token="bench-token-" + "x" * 32)
        b = Links(1, 2, "bench", "127.0.0.1", 10.0, token="bench-token-" + "x" * 32)
        a.peers = b.peers = [a.address, b.address]
        accepted = threading.Thread(
            target=b.get, args=(0, call, Wait(rank=1, deadline=time.monotonic() + 10))
        )
        t0 = time.perf_counter()
        accepted.start()
        a.get(1, call, Wait(rank=0, deadline=time.monotonic() + 10))
        accepted.join()
        times["auth"].append(time.perf_counter() - t0)
        a.close()
        b.close()
        times["bare"].append(_bare_link())
    return times


def _bare_link() -> float:
    """A connect, an accept and a 16-byte hello: a link with nothing proved."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        t0 = time.perf_counter()
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        client.sendall(b"h" * 16)
        got = b""
        while len(got) < 16:
            got += server.recv(16 - len(got))
        elapsed = time.perf_counter() - t0
        client.close()
        server.close()
    return elapsed


def _mac_rank(rounds: int, sizes: list[int]) -> None:
    import numpy as np

    import cclctl

    comm = cclctl.init()
    comm.barrier()  # opens the links (they are made on first use)
    links = comm.transport._links  # type: ignore[attr-defined]  # the TCP transport's
    sessions = dict(links.sessions)
    assert sessions, "run with CCLCTL_LINK_MAC=1 and CCLCTL_TRANSPORT=tcp"
    results: dict[int, dict[str, list[float]]] = {}
    for nbytes in sizes:
        buf = np.zeros(nbytes // 4, np.float32)
        comm.all_reduce(buf)  # warm up

        def call_of(side: str, buf: np.ndarray = buf) -> Callable[[], object]:
            comm.barrier()  # both ranks switch between the same two messages
            links.sessions = dict(sessions) if side == "on" else {}
            return lambda: comm.all_reduce(buf)

        results[nbytes] = run_rounds(rounds, SIZES[nbytes], call_of, comm.barrier)
    links.sessions = dict(sessions)
    comm.close()
    if comm.rank == 0:
        print(json.dumps({str(k): v for k, v in results.items()}), flush=True)


def _mac(args: argparse.Namespace) -> None:
    if "RANK" in os.environ:
        _mac_rank(args.rounds, args.sizes)
        return
    from cclctl.launch.launcher import launch

    out: list[str] = []
    cmd = [sys.executable, __file__, "mac", "--rounds", str(args.rounds), "--sizes"]
    result = launch(
        cmd + [str(s) for s in args.sizes],
        2,
        env={"CCLCTL_TRANSPORT": "tcp", "CCLCTL_LINK_MAC": "1"},
        capture_rank0_stdout=out.append,
    )
    if result.returncode != 0 or not out:
        sys.exit(f"benchmark ranks failed (exit {result.returncode})")
    summary = {size: summarize(times) for size, times in json.loads(out[-1]).items()}
    print(f"cclctl all_reduce over TCP, 2 ranks, {args.rounds} rounds; MAC off vs on")
    print(render(summary, "no MAC", "MAC"))
    if args.json:
        args.json.write_text(json.dumps({"ranks": 2, "sizes": summary}, indent=2) + "\n")


def _handshake(args: argparse.Namespace) -> None:
    times = _handshakes(args.rounds)
    print(f"link setup over loopback, {args.rounds} rounds (median, 95% CI of the median)")
    for side, label in (("bare", "connect + 16 B hello"), ("auth", "authenticated link")):
        low, high = bootstrap_median(times[side])
        med = statistics.median(times[side])
        print(f"  {label:<22} {med * 1e6:8.0f} us  [{low * 1e6:.0f}, {high * 1e6:.0f}]")
    extra = [b - a for a, b in zip(times["bare"], times["auth"], strict=True)]
    low, high = bootstrap_median(extra)
    print(
        f"  auth adds              {statistics.median(extra) * 1e6:8.0f} us"
        f"  [{low * 1e6:.0f}, {high * 1e6:.0f}] per link"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    hs = sub.add_parser("handshake", help="time to set up a link, with and without auth")
    hs.add_argument("--rounds", type=int, default=200)
    mac = sub.add_parser("mac", help="all_reduce over TCP with and without CCLCTL_LINK_MAC")
    mac.add_argument("--rounds", type=int, default=20)
    mac.add_argument(
        "--sizes", type=int, nargs="+", choices=sorted(SIZES), default=sorted(SIZES),
        metavar="BYTES", help="message sizes (of 1048576, 67108864; default both)",
    )  # fmt: skip
    mac.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    (_handshake if args.what == "handshake" else _mac)(args)


if __name__ == "__main__":
    main()
