"""A plain torch.distributed (gloo) job for the integration tests. It never calls cclctl:
``cclctl run`` instruments it from outside. Run under a launcher (RANK, WORLD_SIZE, MASTER_*).

``ops``: every wrapped collective, sync and async, plus calls torch rejects; prints one JSON
line ``{"results": ...}`` (values, return types, errors) and, when instrumented, one line
``{"records": ...}`` read from cclctl's session.

``hang FLAG``: two calls, then the last rank stays in its own code until FLAG exists while
the others wait in an all_reduce (that rank "never enters").
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
out: dict = {}


def note(name, value):
    out[name] = value.tolist() if isinstance(value, torch.Tensor) else value


def attempt(name, fn):
    try:
        note(name, type(fn()).__name__)
    except Exception as exc:
        note(name, f"{type(exc).__name__}: {exc}")


def ops():
    t = torch.arange(4, dtype=torch.float32) + rank
    note("all_reduce.ret", type(dist.all_reduce(t)).__name__)
    note("all_reduce", t)
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    note("async.ret", type(work).__name__)
    note("async.wait", work.wait())
    note("async", t)
    parts = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(parts, t + rank)
    note("all_gather", torch.cat(parts))
    whole = torch.zeros(4 * world)
    dist.all_gather_into_tensor(whole, t + rank)
    note("all_gather_into_tensor", whole)
    mine = torch.zeros(2)
    dist.reduce_scatter_tensor(mine, torch.arange(2.0 * world) * (rank + 1))
    note("reduce_scatter_tensor", mine)
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=world - 1)
    note("broadcast", b)
    r = torch.full((3,), float(rank + 1))
    dist.reduce(r, dst=0, op=dist.ReduceOp.PRODUCT)
    note("reduce", r if rank == 0 else "n/a")
    a2a = torch.zeros(2 * world)
    dist.all_to_all_single(a2a, torch.arange(2.0 * world) + 10 * rank)
    note("all_to_all_single", a2a)
    outs = [torch.zeros(1) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((1,), float(10 * rank + j)) for j in range(world)])
    note("all_to_all", torch.cat(outs))
    peer = (rank + 1) % world
    back = (rank - 1) % world
    got = torch.zeros(2)
    if rank % 2 == 0:
        note("send.ret", dist.send(torch.full((2,), float(rank)), peer))
        note("recv.ret", dist.recv(got, back))
    else:
        note("recv.ret", dist.recv(got, back))
        note("send.ret", dist.send(torch.full((2,), float(rank)), peer))
    note("recv", got)
    inbox = torch.zeros(2)
    sends = dist.isend(torch.full((2,), 5.0 + rank), peer)
    recvs = dist.irecv(inbox, back)
    note("isend.ret", type(sends).__name__)
    sends.wait()
    recvs.wait()
    note("irecv", inbox)
    box = torch.zeros(2)
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), 7.0 + rank), peer),
        dist.P2POp(dist.irecv, box, back),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    note("batch_isend_irecv", box)
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    note("all_gather_object", objects)
    sub = dist.new_group([0, 1])
    s = torch.ones(2) * (rank + 1)
    if rank in (0, 1):
        dist.all_reduce(s, group=sub)
        dist.all_reduce(s, dist.ReduceOp.SUM, sub)  # op and group by position
        dist.all_reduce(tensor=s, group=sub)  # every argument by keyword
    note("subgroup", s)
    solo = dist.new_group([0])
    if rank == 1:  # not a member: torch warns and returns; cclctl records nothing
        note("nonmember.ret", type(dist.all_reduce(torch.ones(1), group=solo)).__name__)
    note("barrier.ret", type(dist.barrier()).__name__)
    attempt("error.not_a_tensor", lambda: dist.all_reduce([1.0, 2.0]))
    attempt("error.bad_src", lambda: dist.broadcast(torch.ones(1), src=world + 3))
    attempt("error.avg_on_gloo", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.AVG))
    print(json.dumps({"results": out}), flush=True)


def records():
    telemetry = sys.modules.get("cclctl.integrations.torch.wrap")
    sess = telemetry.session() if telemetry else None
    if sess is None:
        return
    deadline = time.monotonic() + 10
    while sess.telemetry.inflight() and time.monotonic() < deadline:
        time.sleep(0.01)  # async works close from gloo's thread
    recs = [
        [r.comm, r.seq, r.op, r.state, r.dtype, r.count, r.nbytes, r.root, r.peer, r.duration_ns]
        for r in sess.telemetry.records()
    ]
    comms = {
        k: [v.ranks, v.last_started, v.last_completed]
        for k, v in sess.telemetry.comm_infos().items()
    }
    print(json.dumps({"records": recs, "comms": comms}), flush=True)


if mode == "ops":
    ops()
    records()
elif mode == "hang":
    flag = sys.argv[2]
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.barrier()
    if rank == world - 1:
        give_up = time.monotonic() + 300  # a backstop: the test releases or stops it first
        while not os.path.exists(flag):  # stuck in its own code, not in a collective
            if time.monotonic() > give_up:
                raise SystemExit(f"{flag} never appeared")
            time.sleep(0.05)
    dist.all_reduce(t)
    print("released", flush=True)
dist.destroy_process_group()
