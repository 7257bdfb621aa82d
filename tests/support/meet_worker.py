"""A rank that says how its transport was agreed, then all-reduces once.

Prints ``{"rank", "transport", "fanin_keys", "exchange_keys", "own_address"}``: how many
keys of the fan-in meeting (``transport/0/``) and of the exchange rounds (``x/transport/``)
the job's store holds once this rank is in, and whether the rank's address is in a key of
its own (it met through the store, not through its host agent). ``FAKE_HOSTS=k`` puts
rank r on host ``fake<r % k>``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import cclctl
from cclctl.config import rendezvous_from_env
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore


def main() -> int:
    hosts = int(os.environ.get("FAKE_HOSTS", "0"))
    flags = {"hostname": f"fake{int(os.environ['RANK']) % hosts}"} if hosts else {}
    comm = cclctl.init(**flags)
    where = rendezvous_from_env()
    token = os.environ.get("CCLCTL_TOKEN") or None
    with StoreClient(where.store_host, where.store_port, token=token) as client:
        scoped = ScopedStore.for_job(client, comm.cfg.job)
        fanin, exchange = scoped.list("transport/0/"), scoped.list("x/transport/")
    say = {"rank": comm.rank, "transport": comm.transport.name, "fanin_keys": len(fanin),
           "exchange_keys": len(exchange),
           "own_address": f"transport/0/addr/{comm.rank}" in fanin}  # fmt: skip
    print(json.dumps(say), flush=True)
    x = np.full(1000, comm.rank + 1.0, np.float32)
    comm.all_reduce(x)
    if not (x == comm.world_size * (comm.world_size + 1) // 2).all():
        raise SystemExit(f"rank {comm.rank}: wrong all_reduce result")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
