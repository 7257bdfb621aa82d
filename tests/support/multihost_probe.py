"""A rank that reports which peers it reached over TCP after one large all_reduce, and
which algorithm ran it."""

from __future__ import annotations

import json

import numpy as np
from cma_worker import Algos

import cclctl

comm = cclctl.init()
algos = Algos(comm.tracer)
comm.tracer = algos
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
            "algos": algos.algos,
        }
    )
)
comm.close()
