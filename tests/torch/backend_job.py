"""A job on the ``cclctl`` backend with a gloo group beside it, for test_torch_backend.py.
Run under a launcher (RANK, WORLD_SIZE, MASTER_*): ``python backend_job.py OUT``.

Every collective runs on the default group (``cclctl``) and on a gloo group of the same
ranks with the same inputs, for float32 and int64 (some for half precision and bool); a
``new_group`` on cclctl against gloo's; then ``Work.wait`` and futures, an error through
``wait()``; DDP (several buckets; with a communication hook), FSDP2 and functional
collectives on each backend; and the rank's cclctl telemetry dumped. Each rank writes
``OUT/rank<r>.json``.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import cclctl.torch  # noqa: F401  # registers the backend

out_dir = sys.argv[1]
dist.init_process_group("cclctl", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
cclctl_pg = dist.group.WORLD
doc: dict = {"rank": rank, "backend": dist.get_backend(), "same": {}}


def inputs(dtype: torch.dtype, rows: int = 2 * world) -> torch.Tensor:
    base = torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3) * (rank + 1) - rank
    return base.to(dtype)


def each(fn, dtypes=(torch.float32, torch.int64)):
    """``fn(group, dtype)`` on both groups: True when the results are equal, "close" when
    they are to half precision's rounding (sums of more than two, in another order)."""
    for dtype in dtypes:
        got, want = fn(cclctl_pg, dtype), fn(gloo, dtype)
        pairs = list(zip(got, want, strict=True))
        same = all(torch.equal(a, b) for a, b in pairs)
        close = all(torch.allclose(a.double(), b.double(), rtol=0.02) for a, b in pairs)
        doc["same"][f"{fn.__name__}/{dtype}"] = True if same else "close" if close else False


def all_reduce(g, dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
    results = []
    for op in ops:
        t = inputs(dtype)
        dist.all_reduce(t, op=op, group=g)
        results.append(t)
    return results


def strided(g, dtype):
    t = inputs(dtype).t()  # not contiguous: copied in and back
    dist.all_reduce(t, group=g)
    return [t]


def broadcast(g, dtype):
    t = inputs(dtype)
    dist.broadcast(t, src=world - 1, group=g)
    return [t]


def reduce(g, dtype):
    t = inputs(dtype)
    dist.reduce(t, dst=1 % world, group=g)
    return [t] if rank == 1 % world else []


def all_gather(g, dtype):
    outs = [torch.empty(2 * world, 3, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, inputs(dtype), group=g)
    one = torch.empty(world * 2 * world, 3, dtype=dtype)
    dist.all_gather_into_tensor(one, inputs(dtype), group=g)
    return [*outs, one]


def reduce_scatter(g, dtype):
    out = torch.empty(2, 3, dtype=dtype)
    dist.reduce_scatter(out, list(inputs(dtype).chunk(world)), group=g)
    one = torch.empty(2, 3, dtype=dtype)
    dist.reduce_scatter_tensor(one, inputs(dtype), group=g)
    return [out, one]


def all_to_all(g, dtype):
    one = torch.empty(2 * world, 3, dtype=dtype)
    dist.all_to_all_single(one, inputs(dtype), group=g)
    outs = [torch.empty(2, 3, dtype=dtype) for _ in range(world)]
    dist.all_to_all(outs, list(inputs(dtype).chunk(world)), group=g)
    return [one, *outs]


def uneven(g, dtype):
    """all_to_all_single with blocks of 1-3 rows, different for each pair of ranks, and the
    list form of the same blocks (gloo's list form takes equal blocks only: its single form
    is the reference)."""
    ins = [(rank + j) % 3 + 1 for j in range(world)]
    outs = [(i + rank) % 3 + 1 for i in range(world)]
    out = torch.empty(sum(outs), 3, dtype=dtype)
    dist.all_to_all_single(out, inputs(dtype, sum(ins)), outs, ins, group=g)
    src = list(inputs(dtype, sum(ins)).split(ins))
    if g is gloo:
        whole = torch.empty(sum(outs), 3, dtype=dtype)
        dist.all_to_all_single(whole, torch.cat(src), outs, ins, group=g)
        blocks = list(whole.split(outs))
    else:
        blocks = [torch.empty(k, 3, dtype=dtype) for k in outs]
        dist.all_to_all(blocks, src, group=g)
    return [out, *blocks]


def mixed(g, dtype):
    """Splits equal on rank 0 (a row to and from each rank) and unequal on the others (two
    rows among themselves): the ranks still run one collective together."""
    splits = [1 if rank == 0 or j == 0 else 2 for j in range(world)]
    out = torch.empty(sum(splits), 3, dtype=dtype)
    dist.all_to_all_single(out, inputs(dtype, sum(splits)), splits, splits, group=g)
    return [out]


def send_recv(g, dtype):
    t = inputs(dtype)
    if rank == 0:
        dist.send(t, dst=1, group=g)
        dist.recv(t, src=1, group=g)
    elif rank == 1:
        dist.recv(t, src=0, group=g)
        dist.send(t * 2, dst=0, group=g)
    return [t]


def coalesced(g, dtype):
    a, b = inputs(dtype), inputs(dtype, 3)
    dist.all_reduce_coalesced([a, b], group=g)
    c, d = inputs(dtype), inputs(dtype, 5)
    with dist._coalescing_manager(group=g, async_ops=True) as calls:
        dist.all_reduce(c, group=g)
        dist.all_reduce(d, group=g)
    calls.wait()
    return [a, b, c, d]


def gather_scatter(g, dtype):
    root = world - 1
    outs = [torch.empty(2 * world, 3, dtype=dtype) for _ in range(world)]
    dist.gather(inputs(dtype), outs if rank == root else None, dst=root, group=g)
    one = torch.empty(2, 3, dtype=dtype)
    blocks = list(inputs(dtype).chunk(world)) if rank == root else None
    dist.scatter(one, blocks, src=root, group=g)
    return [*(outs if rank == root else []), one]


for fn in (all_reduce, strided, broadcast, reduce, all_gather, reduce_scatter, all_to_all,
           uneven, mixed, send_recv, coalesced, gather_scatter):  # fmt: skip
    each(fn)
    dist.barrier()
each(all_reduce, (torch.bfloat16, torch.float16))  # bfloat16 through ml_dtypes
each(all_gather, (torch.bool,))  # moved as bytes

# a new_group on the cclctl backend (a sub-communicator) against gloo's of the same ranks
MEMBERS = [0, world - 1]
sub, gloo_sub = dist.new_group(MEMBERS), dist.new_group(MEMBERS, backend="gloo")
if rank in MEMBERS:
    inner = MEMBERS.index(rank)
    for g in (sub, gloo_sub):
        t = inputs(torch.float32)
        dist.all_reduce(t, group=g)
        b = inputs(torch.int64)
        dist.broadcast(b, group_src=1, group=g)
        outs = [torch.empty(2 * world, 3) for _ in MEMBERS]
        dist.all_gather(outs, inputs(torch.float32), group=g)
        doc.setdefault("sub", []).append([t.tolist(), b.tolist(), [o.tolist() for o in outs]])
    doc["sub_comm"] = sub.comm.id
    doc["sub_same"] = doc["sub"][0] == doc["sub"][1]
    del doc["sub"]
dist.barrier()

# Work and futures: issue order kept, a future's callback sees the result
t1, t2 = torch.ones(5), torch.full((5,), 2.0)
w1 = dist.all_reduce(t1, async_op=True)
w2 = dist.all_reduce(t2, async_op=True)
doubled = w2.get_future().then(lambda f: f.value()[0] * 2)
w1.wait()
w2.wait()
doc["work"] = [t1.tolist(), t2.tolist(), doubled.wait().tolist(), w1.is_completed()]
avg = torch.full((3,), float(rank + 1))
dist.all_reduce(avg, op=dist.ReduceOp.AVG)
doc["avg"] = avg.tolist()

# an error of the runtime's through wait(): a typed error, with its fields
try:
    cclctl_pg._allgather_base(torch.empty(world * 4 + 1), torch.ones(4)).wait()
    doc["error"] = None
except Exception as exc:
    doc["error"] = [type(exc).__name__, getattr(exc, "fields", {}).get("op"), str(exc)]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 40), torch.nn.ReLU(), torch.nn.Linear(40, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 8),
    )  # fmt: skip


def steps(net: torch.nn.Module, wrapped: torch.nn.Module) -> list[float]:
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = wrapped(torch.randn(8, 32, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train(group, hook=None) -> tuple[list[float], list[float]]:
    """DDP of several buckets (``hook``: a communication hook of DDP's)."""
    net = model()
    ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=group, bucket_cap_mb=0.004)
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    losses = steps(net, ddp)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    return losses, flat.tolist()


def fsdp(group) -> list[float]:
    """FSDP2: ``fully_shard`` per layer and on the model, over ``group``'s mesh."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    net = model()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return steps(net, net)


def functional(group) -> list[list[float]]:
    """Functional collectives (issued from C++ through torch's dispatcher)."""
    import torch.distributed._functional_collectives as fc

    x = inputs(torch.float32).reshape(-1)
    return [
        fc.wait_tensor(fc.all_reduce(x, "sum", group)).tolist(),
        fc.wait_tensor(fc.all_gather_single(x, 0, group)).tolist(),
        fc.wait_tensor(fc.reduce_scatter_tensor(x, "sum", 0, group)).tolist(),
    ]


hook = default_hooks.allreduce_hook
doc["ddp"] = {"cclctl": train(cclctl_pg), "gloo": train(gloo), "hook": train(cclctl_pg, hook)}
doc["fsdp"] = {"cclctl": fsdp(cclctl_pg), "gloo": fsdp(gloo)}
doc["functional_same"] = functional(cclctl_pg) == functional(gloo)
params = torch.tensor(doc["ddp"]["cclctl"][1])
every = [torch.empty_like(params) for _ in range(world)]
dist.all_gather(every, params, group=gloo)
doc["params_alike"] = all(torch.equal(every[0], p) for p in every)

telemetry = cclctl_pg.comm.tracer
telemetry.fold()
doc["dump"] = telemetry.dump("backend test", os.path.join(out_dir, f"dump{rank}.json"))
doc["comm"] = cclctl_pg.comm.id
doc["ops"] = sorted({rec.op for rec in telemetry.records()})
doc["comms"] = sorted({rec.comm for rec in telemetry.records()})
dist.destroy_process_group()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(doc, f)
