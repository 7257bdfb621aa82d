"""Run in a network namespace of its own: a loopback connection whose receiver never reads
(``window``) or whose packets iptables drops on the way in (``drop``) or out
(``blocked``, as where the interface is down), and what
:func:`cclctl.runtime.transport.tcp.stall.stalled` says of the sender. Prints one JSON line:
``{"stalled": bool, "last_data_sent_ms": int}``.

``window``: the sender fills the receiver's window and asks again and again until it has
sent nothing for ten times the threshold (the window stays closed, its probes answered
ever more rarely): stalled if it ever said so. Otherwise the sender
sends and asks until it says stalled (or 20 s pass).
"""

import json
import select
import socket
import struct
import subprocess
import sys
import time

from cclctl.runtime.transport.tcp.stall import stalled

AFTER_MS = 300
how = sys.argv[1]
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
sender = socket.create_connection(("127.0.0.1", port))
receiver, _ = server.accept()
sender.setblocking(False)
if how in ("drop", "blocked"):  # dropped on the way in (lost), or out (cannot send)
    chain = "INPUT" if how == "drop" else "OUTPUT"
    subprocess.run(["iptables", "-A", chain, "-p", "tcp", "--dport", str(port), "-j", "DROP"],
                   check=True)  # fmt: skip


def last_data_sent_ms() -> int:
    raw = sender.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 60)
    return struct.unpack_from("8B13I", raw)[8 + 9]


deadline = time.monotonic() + 20
verdict = False
while time.monotonic() < deadline:
    try:
        sender.send(b"x" * 65536)
        continue
    except BlockingIOError:
        select.select([], [sender], [], 0.05)
    if how == "window":
        verdict = verdict or stalled(sender, AFTER_MS)
        if last_data_sent_ms() >= 10 * AFTER_MS:
            break
        continue
    if how != "window" and stalled(sender, AFTER_MS):
        verdict = True
        break
print(json.dumps({"stalled": verdict, "last_data_sent_ms": last_data_sent_ms()}))
