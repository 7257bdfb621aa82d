"""Point-to-point exchanges on the ``cclctl`` backend, for test_torch_backend_p2p.py.
Run under a launcher (RANK, WORLD_SIZE, MASTER_*): ``python backend_p2p_job.py OUT``.

Each rank exchanges with its partner (rank ^ 1) by ``isend`` then ``irecv`` on both sides
(the pattern pipeline parallelism uses; it outgrows the links' buffering from a few MiB),
at 4 MiB and 16 MiB; then a ring by ``batch_isend_irecv`` (a send to the next rank and a
receive from the previous, issued in that order everywhere); then an all_reduce after
them. Each rank writes ``OUT/rank<r>.json``: whether every tensor received holds exactly
what its sender sent, and its send and recv records (peer and per-pair seq).
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import cclctl.torch  # noqa: F401  # registers the backend

out_dir = sys.argv[1]
dist.init_process_group("cclctl", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
doc: dict = {"rank": rank, "exact": {}}


def payload(sender: int, nbytes: int, salt: int) -> torch.Tensor:
    """What ``sender`` sends: distinct per sender, size and call, every element checked."""
    n = nbytes // 4
    return torch.arange(n, dtype=torch.int32) * (sender + 2) + salt


partner = rank ^ 1
if partner < world:
    for mib in (4, 16):
        sent = payload(rank, mib << 20, mib)
        got = torch.zeros_like(sent)
        sending = dist.isend(sent, dst=partner)
        receiving = dist.irecv(got, src=partner)
        sending.wait()
        receiving.wait()
        doc["exact"][f"pair/{mib}MiB"] = torch.equal(got, payload(partner, mib << 20, mib))

nxt, prev = (rank + 1) % world, (rank - 1) % world
sent = payload(rank, 4 << 20, 7)
got = torch.zeros_like(sent)
ops = [dist.P2POp(dist.isend, sent, nxt), dist.P2POp(dist.irecv, got, prev)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
doc["exact"]["ring/4MiB"] = torch.equal(got, payload(prev, 4 << 20, 7))

total = torch.ones(3)
dist.all_reduce(total)  # after the point-to-point calls, on the collective lane
doc["exact"]["all_reduce"] = total.tolist() == [float(world)] * 3

telemetry = dist.group.WORLD.comm.tracer
telemetry.fold()
doc["p2p"] = sorted(
    [rec.op, rec.peer, rec.seq, rec.state, rec.nbytes]
    for rec in telemetry.records()
    if rec.op in ("send", "recv")
)
dist.destroy_process_group()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(doc, f)
