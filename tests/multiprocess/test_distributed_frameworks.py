"""The accord torch.distributed backend under what users run on it, on real ranks.

- DDP (``no_sync`` steps, bucket views, static graph, the fp16 compression hook, a custom hook
  on ``bucket.buffer()``) and FSDP2 train to the parameters the same runs reach on Gloo, bit for
  bit;
- DTensor's redistributions on 1-D and 2-D meshes, torch.distributed.checkpoint saved on 2 ranks
  and loaded on 1 and on 4, and torch.compile of functional collectives give the values computed
  here independently;
- sub-groups (``new_group``, ``new_subgroups``, DeviceMesh) are engine process sets of their
  own: one group's collectives complete while a disjoint group's collective waits, and destroying
  a group removes its set;
- ``hvd.*`` and ``dist.*`` work side by side in one process, whichever of ``hvd.init()`` and
  ``init_process_group("accord")`` comes first;
- a communication library registered with ``accord.comm.register_backend`` and chosen with
  ACCORD_CPU_BACKEND carries DDP's traffic.

Several cases share one set of ranks (starting ranks and compiling are the slow parts on 2
cores); each case's outcome comes back separately, so a failing case fails its own test.
"""
from __future__ import annotations

import os
import traceback
from datetime import timedelta

import numpy as np
import pytest
import torch
from helpers.marks import mark, wait_marked
from helpers.ranks import run_ranks

from accord import comm

pytestmark = pytest.mark.timeout(300)

STEPS = 20
LR = 0.1
TORCH_25 = torch.__version__ >= "2.5"
# FSDP2 before torch 2.5 is CUDA-only: it makes CUDA streams and events whatever the mesh's
# device (on Gloo too, torch 2.4.1 fails on a CPU mesh with a CUDA error).
FSDP2_NEEDS_CUDA = not TORCH_25
FSDP2_SKIP = f"FSDP2 in torch {torch.__version__} is CUDA-only (it creates CUDA streams on a CPU mesh too)"


# --- shared pieces ------------------------------------------------------------------------------

def _mlp(seed):
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _params(module):
    return [p.detach().numpy().copy() for p in module.parameters()]


def _dtensor_api():
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    return DTensor, Partial, Replicate, Shard, distribute_tensor


def _full(seed, shape):
    return np.random.default_rng(seed).integers(-8, 9, size=shape).astype("float32")


def _custom_hook(state, bucket):
    import torch.distributed as dist

    grads = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(grads, async_op=True).get_future().then(lambda f: f.value()[0])


DDP_VARIANTS = {
    "default": ({}, None),
    "bucket_view_static_graph": ({"gradient_as_bucket_view": True, "static_graph": True}, None),
    "fp16_compress_hook": ({}, "fp16"),
    "custom_hook": ({"gradient_as_bucket_view": True}, "custom"),
}


def _ddp(rank, variant):
    """STEPS steps of DDP; every third step first accumulates a batch under ``no_sync()``. Each
    rank starts from other weights (DDP's broadcast at construction makes them equal)."""
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs, hook = DDP_VARIANTS[variant]
    model = DDP(_mlp(seed=rank), **kwargs)
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "custom":
        model.register_comm_hook(None, _custom_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        if step % 3 == 1:
            with model.no_sync():
                x, y = _batch(rank, 100 + step)
                nn.functional.mse_loss(model(x), y).backward()
        x, y = _batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return _params(model.module)


def _fsdp2(rank, size):
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (size,))
    model = _mlp(seed=0)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(10):
        opt.zero_grad()
        x, y = _batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.full_tensor().detach().numpy().copy() for p in model.parameters()]


def _dtensor_1d(rank, size):
    from torch.distributed.device_mesh import init_device_mesh

    DTensor, Partial, Replicate, Shard, distribute_tensor = _dtensor_api()
    mesh = init_device_mesh("cpu", (size,))
    full = torch.from_numpy(_full(0, (4, 6)))
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    partial = DTensor.from_local(torch.from_numpy(_full(10 + rank, (4, 6))), mesh, [Partial()])
    got = {
        "shard0": sharded.to_local(),
        "shard0_to_replicate": sharded.redistribute(mesh, [Replicate()]).to_local(),
        "shard0_to_shard1": sharded.redistribute(mesh, [Shard(1)]).to_local(),
        "replicate_to_shard1": distribute_tensor(full, mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).to_local(),
        "partial_to_replicate": partial.redistribute(mesh, [Replicate()]).to_local(),
        "partial_to_shard0": partial.redistribute(mesh, [Shard(0)]).to_local(),
        "op_on_shards": (sharded * 2 + 1).full_tensor(),
    }
    return {k: v.numpy().copy() for k, v in got.items()}


def _compiled_funcol(rank, size):
    """A function of functional collectives on the default group and on a sub-group, compiled
    (inductor) and eager."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    sub = dist.new_group(list(range(size)))
    world = dist.group.WORLD

    def f(x):
        summed = funcol.all_reduce(x * 2, "sum", world)
        gathered = funcol.all_gather_tensor(summed + 1, 0, sub)
        scattered = funcol.reduce_scatter_tensor(gathered, "sum", 0, world)
        maxed = funcol.all_reduce(x, "max", sub)
        return summed, gathered, scattered, maxed

    x = torch.arange(4, dtype=torch.float32) + rank
    compiled = torch.compile(f, fullgraph=True)(x)
    eager = f(x)
    return {"compiled": [t.numpy().copy() for t in compiled], "eager": [t.numpy().copy() for t in eager]}


def _frameworks(rank, size, with_compile):
    cases = {f"ddp:{v}": (lambda v=v: _ddp(rank, v)) for v in DDP_VARIANTS}
    if not FSDP2_NEEDS_CUDA:
        cases["fsdp2"] = lambda: _fsdp2(rank, size)
    cases["dtensor"] = lambda: _dtensor_1d(rank, size)
    if with_compile:
        cases["compile"] = lambda: _compiled_funcol(rank, size)
    out = {}
    for name, case in cases.items():
        try:
            out[name] = ("ok", case())
        except Exception:  # noqa: BLE001 (the case's own test reports it)
            out[name] = ("error", traceback.format_exc())
    return out


@pytest.fixture(scope="module")
def frameworks():
    """Every case on 2 accord ranks, and the same (but compiling) on 2 Gloo ranks."""
    return {"accord": run_ranks(_frameworks, 2, True, init="torch:accord", timeout=240,
                                env={"TORCHINDUCTOR_COMPILE_THREADS": "1"}),
            "gloo": run_ranks(_frameworks, 2, False, init="torch", timeout=120)}


def _case(results, name, rank):
    status, value = results[rank][name]
    assert status == "ok", f"rank {rank}:\n{value}"
    return value


def _bitwise_equal(got, expected):
    return len(got) == len(expected) and all(
        a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(got, expected))


# --- DDP, FSDP2 --------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(DDP_VARIANTS))
def test_ddp_trains_to_the_parameters_it_reaches_on_gloo(frameworks, variant):
    initial = _params(_mlp(seed=0))  # rank 0's start, which DDP broadcasts
    for rank in (0, 1):
        got = _case(frameworks["accord"], f"ddp:{variant}", rank)
        expected = _case(frameworks["gloo"], f"ddp:{variant}", rank)
        assert _bitwise_equal(got, expected), f"rank {rank}: {variant} differs from gloo"
        assert _bitwise_equal(got, _case(frameworks["accord"], f"ddp:{variant}", 0))
        assert not _bitwise_equal(got, initial)  # it trained


@pytest.mark.skipif(FSDP2_NEEDS_CUDA, reason=FSDP2_SKIP)
def test_fsdp2_trains_to_the_parameters_it_reaches_on_gloo(frameworks):
    initial = _params(_mlp(seed=0))
    for rank in (0, 1):
        got = _case(frameworks["accord"], "fsdp2", rank)
        assert _bitwise_equal(got, _case(frameworks["gloo"], "fsdp2", rank)), f"rank {rank}"
        assert not _bitwise_equal(got, initial)


# --- DTensor, functional collectives under torch.compile ----------------------------------------

def _expected_dtensor_1d(rank, size):
    full = _full(0, (4, 6))
    total = sum(_full(10 + r, (4, 6)) for r in range(size))
    rows, cols = 4 // size, 6 // size
    return {
        "shard0": full[rank * rows:(rank + 1) * rows],
        "shard0_to_replicate": full,
        "shard0_to_shard1": full[:, rank * cols:(rank + 1) * cols],
        "replicate_to_shard1": full[:, rank * cols:(rank + 1) * cols],
        "partial_to_replicate": total,
        "partial_to_shard0": total[rank * rows:(rank + 1) * rows],
        "op_on_shards": full * 2 + 1,
    }


def test_dtensor_redistributes_between_shard_replicate_and_partial(frameworks):
    for rank in (0, 1):
        got = _case(frameworks["accord"], "dtensor", rank)
        expected = _expected_dtensor_1d(rank, 2)
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"rank {rank}: {name}")
            np.testing.assert_array_equal(got[name], _case(frameworks["gloo"], "dtensor", rank)[name])


def test_compiled_functional_collectives_equal_eager(frameworks):
    size = 2
    xs = [np.arange(4, dtype="float32") + r for r in range(size)]
    summed = sum(2 * x for x in xs)
    gathered = np.concatenate([summed + 1] * size)
    for rank in (0, 1):
        got = _case(frameworks["accord"], "compile", rank)
        expected = [summed, gathered, size * gathered[4 * rank:4 * (rank + 1)], np.maximum(*xs)]
        for name in ("compiled", "eager"):
            assert len(got[name]) == len(expected)
            for i, (a, b) in enumerate(zip(got[name], expected)):
                np.testing.assert_array_equal(a, b, err_msg=f"rank {rank} {name} output {i}")


# --- torch.distributed.checkpoint across world sizes ---------------------------------------------

CKPT_ROWS = 10  # 2 ranks hold 5 rows each; 4 ranks hold 3, 3, 3 and 1


def _checkpoint_state(size, empty):
    from torch.distributed.device_mesh import init_device_mesh

    _, _, _, Shard, distribute_tensor = _dtensor_api()
    mesh = init_device_mesh("cpu", (size,))
    weight, bias = _full(1, (CKPT_ROWS, 3)), _full(2, (7,))
    if empty:
        weight, bias = np.zeros_like(weight), np.zeros_like(bias)
    return {"weight": distribute_tensor(torch.from_numpy(weight), mesh, [Shard(0)]),
            "bias": torch.from_numpy(bias), "step": torch.tensor(0 if empty else 7)}


def _save_checkpoint(rank, size, path):
    import torch.distributed.checkpoint as dcp

    dcp.save(_checkpoint_state(size, empty=False), checkpoint_id=path)
    return sorted(os.listdir(path))


def _load_checkpoint(rank, size, path):
    import torch.distributed.checkpoint as dcp

    state = _checkpoint_state(size, empty=True)
    dcp.load(state, checkpoint_id=path)
    return {"local": state["weight"].to_local().numpy().copy(),
            "full": state["weight"].full_tensor().numpy().copy(),
            "bias": state["bias"].numpy().copy(), "step": int(state["step"])}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp") / "ckpt")
    files = run_ranks(_save_checkpoint, 2, path, init="torch:accord", timeout=90)
    assert files[0] == files[1] and any(f.endswith(".distcp") for f in files[0]), files
    return path


@pytest.mark.parametrize("size", [1, 4])
def test_checkpoint_saved_on_two_ranks_loads_on_another_world_size(checkpoint, size):
    results = run_ranks(_load_checkpoint, size, checkpoint, init="torch:accord", timeout=120)
    weight = _full(1, (CKPT_ROWS, 3))
    rows = -(-CKPT_ROWS // size)  # DTensor's shards: ceil(rows / size) each, the last one shorter
    for rank, got in enumerate(results):
        np.testing.assert_array_equal(got["full"], weight)
        np.testing.assert_array_equal(got["local"], weight[rank * rows:(rank + 1) * rows])
        np.testing.assert_array_equal(got["bias"], _full(2, (7,)))
        assert got["step"] == 7


# --- sub-groups -----------------------------------------------------------------------------------

def _set_of(group):
    """The engine process set behind an accord group, and its members as the engine has them."""
    from accord import engine

    return group.set_id, engine.process_set_members(group.set_id)


def _removed(set_id):
    from accord import engine

    try:
        engine.process_set_members(set_id)
    except ValueError:
        return True
    return False


def _subgroups(rank, size, marks):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from accord.distributed import AccordProcessGroup

    out = {}
    # Two disjoint groups (torch asks every rank to create every group).
    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = low if rank < 2 else high
    assert isinstance(mine, AccordProcessGroup), type(mine)
    assert (high if rank < 2 else low) == dist.GroupMember.NON_GROUP_MEMBER
    out["pair_set"] = _set_of(mine)

    # Rank 2 starts a collective on the high group that rank 3 joins only once the low group has
    # completed collectives of its own: the low group must not wait for the high group.
    if rank == 2:
        pending = torch.full((3,), 2.0)
        work = dist.all_reduce(pending, group=high, async_op=True)
        mark(marks, "high-started")
        assert wait_marked(marks, "low-done", timeout=60), "the low group never finished"
        out["high_pending_while_low_ran"] = not work.is_completed()
        mark(marks, "high-checked")
        work.wait()
        out["high"] = pending.numpy().copy()
    elif rank == 3:
        assert wait_marked(marks, "high-checked", timeout=60), "the low group never finished"
        late = torch.full((3,), 3.0)
        dist.all_reduce(late, group=high)
        out["high"] = late.numpy().copy()
    else:
        assert wait_marked(marks, "high-started", timeout=60)
        values = []
        for step in range(3):
            t = torch.full((2,), float(rank + 1 + step))
            dist.all_reduce(t, group=low)
            values.append(t.numpy().copy())
        b = torch.full((2,), float(rank))
        dist.broadcast(b, src=1, group=low)  # a global rank
        values.append(b.numpy().copy())
        out["low"] = values
        dist.barrier(group=low)
        if rank == 0:
            mark(marks, "low-done")

    # new_subgroups: consecutive pairs.
    sub, _ = dist.new_subgroups(group_size=2)
    assert isinstance(sub, AccordProcessGroup)
    out["subgroup_set"] = _set_of(sub)
    t = torch.full((1,), float(rank))
    dist.all_reduce(t, group=sub)
    out["subgroup_sum"] = float(t)

    # A 2-D mesh: "dp" groups {0, 2} and {1, 3}, "tp" groups {0, 1} and {2, 3}.
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        group = mesh[dim].get_group()
        assert isinstance(group, AccordProcessGroup), (dim, type(group))
        out[f"{dim}_set"] = _set_of(group)
        t = torch.full((1,), float(rank + 1))
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=group)
        out[f"{dim}_product"] = float(t)
    out["mesh_2d"] = _dtensor_2d(mesh, rank)

    # Destroying a group removes its process set (on its members: the set is theirs alone).
    for group in (mine, sub):
        dist.destroy_process_group(group)
    out["removed"] = [_removed(out[f"{g}_set"][0]) for g in ("pair", "subgroup", "dp", "tp")]
    t = torch.ones(1)
    dist.all_reduce(t, group=mesh["tp"].get_group())  # the others still work
    out["tp_after"] = float(t)
    return out


def _dtensor_2d(mesh, rank):
    DTensor, Partial, Replicate, Shard, distribute_tensor = _dtensor_api()
    full = torch.from_numpy(_full(3, (4, 4)))
    sharded = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    partial = DTensor.from_local(torch.from_numpy(_full(20 + rank, (2, 4))), mesh, [Shard(0), Partial()])
    got = {"shard_shard": sharded.to_local(),
           "to_replicate_shard": sharded.redistribute(mesh, [Replicate(), Shard(1)]).to_local(),
           "full": sharded.full_tensor(),
           "partial_to_replicate": partial.redistribute(mesh, [Shard(0), Replicate()]).to_local()}
    return {k: v.numpy().copy() for k, v in got.items()}


def test_sub_groups_are_process_sets_that_progress_independently_and_are_freed(tmp_path):
    results = run_ranks(_subgroups, 4, str(tmp_path), init="torch:accord", timeout=180)
    low_sums = [np.full(2, float(3 + 2 * step)) for step in range(3)] + [np.full(2, 1.0)]
    full, partial_sum = _full(3, (4, 4)), None
    for rank, got in enumerate(results):
        pair = [0, 1] if rank < 2 else [2, 3]
        row, col = divmod(rank, 2)  # mesh coordinates (dp, tp)
        assert got["pair_set"][1] == tuple(pair) and got["pair_set"][0] != 0
        if rank < 2:
            for a, b in zip(got["low"], low_sums):
                np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_array_equal(got["high"], np.full(3, 5.0))
        if rank == 2:
            assert got["high_pending_while_low_ran"], "the high group's collective finished without rank 3"
        assert got["subgroup_set"][1] == tuple(pair) and got["subgroup_sum"] == sum(pair)
        dp, tp = [col, col + 2], [2 * row, 2 * row + 1]
        assert got["dp_set"][1] == tuple(dp) and got["dp_product"] == np.prod([r + 1 for r in dp])
        assert got["tp_set"][1] == tuple(tp) and got["tp_product"] == np.prod([r + 1 for r in tp])
        sets = {got["pair_set"][0], got["subgroup_set"][0], got["dp_set"][0], got["tp_set"][0]}
        assert len(sets) == 4, got  # one set per group
        mesh = got["mesh_2d"]
        np.testing.assert_array_equal(mesh["shard_shard"], full[2 * row:2 * row + 2, 2 * col:2 * col + 2])
        np.testing.assert_array_equal(mesh["to_replicate_shard"], full[:, 2 * col:2 * col + 2])
        np.testing.assert_array_equal(mesh["full"], full)
        partial_sum = sum(_full(20 + r, (2, 4)) for r in tp)
        np.testing.assert_array_equal(mesh["partial_to_replicate"], partial_sum)
        assert got["removed"] == [True, True, False, False] and got["tp_after"] == 2.0


# --- hvd.* and dist.* in one process --------------------------------------------------------------

def _hvd_and_dist(rank, size, order, port):
    import torch.distributed as dist

    import accord.torch as hvd
    from accord import engine

    def init_dist():
        if not dist.is_initialized():
            store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timedelta(seconds=30))
            dist.init_process_group("accord", store=store, rank=rank, world_size=size,
                                    timeout=timedelta(seconds=60))

    if order == "hvd_first":
        hvd.init()
        init_dist()
    else:
        init_dist()
        hvd.init()
    out = {"ranks": (hvd.rank(), hvd.size(), dist.get_rank(), dist.get_world_size())}
    values = []
    for step in range(3):
        values.append(hvd.allreduce(torch.full((2,), float(rank + step)), op=hvd.Sum, name=f"h{step}").numpy())
        t = torch.full((2,), float(rank * step))
        dist.all_reduce(t)
        values.append(t.numpy().copy())
    out["values"] = values
    out["objects"] = hvd.allgather_object({"rank": rank})
    listed = [None] * size
    dist.all_gather_object(listed, rank * 10)
    out["dist_objects"] = listed
    # The program's first init owns accord: destroying the group stops it only if the group started it.
    dist.destroy_process_group()
    out["alive_after_destroy"] = engine.is_initialized()
    if engine.is_initialized():
        out["hvd_after_destroy"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after").item()
    hvd.shutdown()
    return out


def _torchrun_env(port):
    def env(rank):
        # Empty ACCORD_* values count as unset: the ranks see torchrun's variables only, and
        # torch's store (this test's, standing in for torchrun's agent) at MASTER_PORT.
        return {"ACCORD_RANK": "", "ACCORD_SIZE": "", "RANK": str(rank), "WORLD_SIZE": "2",
                "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "1"}
    return env


@pytest.mark.parametrize("order", ["hvd_first", "dist_first"])
@pytest.mark.parametrize("launcher", ["accordrun", "torchrun"])
def test_hvd_and_dist_collectives_in_one_process(launcher, order):
    """With accordrun's worker contract (and torch's store for init_process_group), or with
    torchrun's variables only."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    try:
        if launcher == "accordrun":
            results = run_ranks(_hvd_and_dist, 2, order, store.port, init="accord", timeout=90)
        else:
            results = run_ranks(_hvd_and_dist, 2, order, store.port, init="none", timeout=90,
                                per_rank_env=_torchrun_env(store.port))
    finally:
        del store
    for rank, got in enumerate(results):
        assert got["ranks"] == (rank, 2, rank, 2)
        for step in range(3):
            np.testing.assert_array_equal(got["values"][2 * step], np.full(2, float(1 + 2 * step)))
            np.testing.assert_array_equal(got["values"][2 * step + 1], np.full(2, float(step)))
        assert got["objects"] == [{"rank": 0}, {"rank": 1}] and got["dist_objects"] == [0, 10]
        assert got["alive_after_destroy"] == (order == "hvd_first")
        if order == "hvd_first":
            assert got["hvd_after_destroy"] == 2.0


# --- a communication library registered with accord.comm -----------------------------------------

CALLS: dict[str, int] = {}


class _Counting(comm.Communicator):
    """The gloo communicator, counting the collectives it carries."""

    def __init__(self, inner):
        self._inner = inner
        self.ranks, self.rank, self.size = inner.ranks, inner.rank, inner.size

    def _count(self, name):
        CALLS[name] = CALLS.get(name, 0) + 1
        return getattr(self._inner, name)

    def allreduce(self, tensor, op):
        return self._count("allreduce")(tensor, op)

    def broadcast(self, tensor, root):
        return self._count("broadcast")(tensor, root)

    def allgather(self, tensor):
        return self._count("allgather")(tensor)

    def gather(self, tensor, root):
        return self._count("gather")(tensor, root)

    def scatter(self, chunks, root):
        return self._count("scatter")(chunks, root)

    def reduce(self, tensor, op, root):
        return self._count("reduce")(tensor, op, root)

    def reduce_scatter(self, tensor, op):
        return self._count("reduce_scatter")(tensor, op)

    def alltoall(self, tensor, splits):
        return self._count("alltoall")(tensor, splits)

    def barrier(self):
        return self._count("barrier")()

    def __getattr__(self, name):  # anything else the engine asks of a communicator
        return getattr(self.__dict__["_inner"], name)


class _CountingBackend(comm.Backend):
    name = "mylib"
    device_types = frozenset({"cpu"})

    def create(self, context):
        return _Counting(comm.get_backend("gloo").create(context))


def _vendor_ddp(rank, size, port):
    import torch.distributed as dist

    import accord.distributed  # noqa: F401 (registers "accord" on torch < 2.5, which has no backend autoload)
    from accord import engine

    comm.register_backend("mylib", _CountingBackend)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timedelta(seconds=30))
    dist.init_process_group("accord", store=store, rank=rank, world_size=size, timeout=timedelta(seconds=60))
    try:
        backend = engine.backend_name("cpu")
        before = dict(CALLS)
        params = _ddp(rank, "default")
        after = dict(CALLS)
    finally:
        dist.destroy_process_group()
    return {"backend": backend, "before": before, "after": after, "params": params}


def test_a_registered_library_carries_ddps_traffic(frameworks):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    try:
        results = run_ranks(_vendor_ddp, 2, store.port, init="none", timeout=90,
                            env={"ACCORD_CPU_BACKEND": "mylib"})
    finally:
        del store
    for rank, got in enumerate(results):
        assert got["backend"] == "mylib"
        grown = {k: got["after"].get(k, 0) - got["before"].get(k, 0) for k in got["after"]}
        # construction: a broadcast of the parameters; then a gradient allreduce per synced step
        assert grown.get("broadcast", 0) >= 1 and grown.get("allreduce", 0) >= STEPS - STEPS // 3, grown
        assert _bitwise_equal(got["params"], _case(frameworks["gloo"], "ddp:default", rank))
