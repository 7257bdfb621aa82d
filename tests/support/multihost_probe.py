"""A rank that reports which peers it reached over TCP after one large all_reduce."""

from __future__ import annotations

import json

import numpy as np

import cclctl

comm = cclctl.init()
x = np.ones(1 << 20, np.float32)
comm.all_reduce(x)
tcp = getattr(comm.transport, "tcp", comm.transport)
sent, _ = tcp.link_bytes()
print(
    json.dumps(
        {
            "rank": comm.rank,
            "transport": comm.transport.name,
            "value": float(x[0]),
            "tcp_peers": [peer for peer, n in enumerate(sent) if n],
        }
    )
)
comm.close()
