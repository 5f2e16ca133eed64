"""The sharded DistributedOptimizer (ZeRO-1/2) on real ranks.

References are computed independently in the same ranks: the unsharded DistributedOptimizer
(every rank steps every parameter) and torch's own ZeroRedundancyOptimizer + DDP on Gloo.
Buckets are made tiny (a few KB) so that every model is cut into several buckets and spans cut
through tensors.
"""
import copy
import itertools

import numpy as np
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(240)

STEPS = 50
TINY_BUCKETS = 0.002  # MB: about 500 float32 elements per bucket

# name -> (torch.optim class name, options); the foreach/fused forms are those torch has on CPU
OPTIMIZERS = {
    "sgd_momentum": ("SGD", {"lr": 0.05, "momentum": 0.9}),
    "sgd_nesterov_wd": ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    "adam": ("Adam", {"lr": 0.01}),
    "adam_foreach": ("Adam", {"lr": 0.01, "foreach": True}),
    "adam_fused": ("Adam", {"lr": 0.01, "fused": True}),
    "adamw": ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    "adamw_fused": ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "fused": True, "amsgrad": True}),
    "adagrad": ("Adagrad", {"lr": 0.05}),
    "rmsprop": ("RMSprop", {"lr": 0.01, "momentum": 0.5}),
}


# elementwise optimizers checked at 2 ranks only (one job for all of them: the suite's time)
MORE_OPTIMIZERS = {
    "adamax": ("Adamax", {"lr": 0.01, "weight_decay": 0.01}),
    "nadam": ("NAdam", {"lr": 0.01}),
    "nadam_decoupled": ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    "radam": ("RAdam", {"lr": 0.01}),  # (its rectified branch starts at step 6: the test takes both)
    "adadelta": ("Adadelta", {"lr": 1.0}),
    "asgd": ("ASGD", {"lr": 0.05, "t0": 10}),  # (averaging from step 10)
    "rprop": ("Rprop", {"lr": 0.01}),
}


def _mlp(seed=0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 20),
                               torch.nn.Tanh(), torch.nn.Linear(20, 3))


def _batch(step, rank, rows=6):
    import torch

    rng = np.random.default_rng([step, rank])
    return (torch.from_numpy(rng.normal(size=(rows, 12)).astype(np.float32)),
            torch.from_numpy(rng.normal(size=(rows, 3)).astype(np.float32)))


def _weights(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


def _make(name, params):
    import torch

    cls, options = {**OPTIMIZERS, **MORE_OPTIMIZERS}[name]
    return getattr(torch.optim, cls)(params, **options)


def _train(model, opt, rank, steps=STEPS, passes=1, first=0):
    import torch

    for step in range(first, first + steps):
        for micro in range(passes):
            x, y = _batch(step * passes + micro, rank)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return _weights(model)


def _sharded_and_unsharded(rank, size, names, sharded_kw, steps=STEPS):
    """Per optimizer: (sharded weights, unsharded weights) after the same training."""
    import accord.torch as hvd

    hvd.init()
    try:
        out = {}
        for name in names:
            plain, sharded = _mlp(), _mlp()
            ref = hvd.DistributedOptimizer(_make(name, plain.parameters()),
                                           named_parameters=plain.named_parameters())
            opt = hvd.DistributedOptimizer(_make(name, sharded.parameters()),
                                           named_parameters=sharded.named_parameters(),
                                           shard_optimizer_state=True, bucket_cap_mb=TINY_BUCKETS,
                                           **sharded_kw)
            out[name] = (_train(sharded, opt, rank, steps), _train(plain, ref, rank, steps))
            ref.remove_hooks()
            opt.remove_hooks()
        return out
    finally:
        hvd.shutdown()


def _assert_weights(got, want, tol, what):
    for i, (g, w) in enumerate(zip(got, want)):
        if tol == 0:
            assert np.array_equal(g, w), f"{what}: parameter {i} differs by {np.abs(g - w).max()}"
        else:
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{what}: parameter {i}")


# Every optimizer at 2 ranks; at 3 and 4 ranks (uneven spans, more of them, 2 cores
# oversubscribed: the suite's slowest jobs) those that differ in how a shard is stepped: plain
# state, moments with decoupled decay, and a fused kernel whose lanes meet the shards' offsets.
AT_MORE_RANKS = ["sgd_momentum", "adam", "adamw", "adamw_fused"]


@pytest.mark.parametrize("nprocs,tol,names", [(2, 0.0, list(OPTIMIZERS)), (3, 1e-6, AT_MORE_RANKS),
                                               (4, 1e-6, AT_MORE_RANKS)], ids=["2", "3", "4"])
def test_zero1_equals_the_unsharded_optimizer(nprocs, tol, names):
    results = run_ranks(_sharded_and_unsharded, nprocs, names, {}, init="accord", timeout=200)
    for rank, per_opt in enumerate(results):
        for name, (sharded, plain) in per_opt.items():
            # A fused kernel runs its vector lanes over other element offsets in a shard than in
            # the whole tensor (its lanes round differently from its scalar tail): not bitwise.
            _assert_weights(sharded, plain, max(tol, 1e-6) if "fused" in name else tol,
                            f"{name} on rank {rank} of {nprocs}")
            # and the parameters are the same on every rank
            _assert_weights(sharded, results[0][name][0], 0.0, f"{name}: rank {rank} vs rank 0")
    # training moved the weights (a test that compares two frozen models proves nothing)
    start = _weights(_mlp())
    assert all(np.abs(a - b).max() > 1e-3 for a, b in zip(results[0]["adam"][0], start))


def test_zero1_equals_the_unsharded_optimizer_for_more_elementwise_optimizers():
    results = run_ranks(_sharded_and_unsharded, 2, list(MORE_OPTIMIZERS), {}, 20, init="accord", timeout=200)
    start = _weights(_mlp())
    for rank, per_opt in enumerate(results):
        for name, (sharded, plain) in per_opt.items():
            _assert_weights(sharded, plain, 0.0, f"{name} on rank {rank}")
            _assert_weights(sharded, results[0][name][0], 0.0, f"{name}: rank {rank} vs rank 0")
            assert all(np.abs(a - b).max() > 1e-3 for a, b in zip(sharded, start)), f"{name} did not train"


def _torch_zero(rank, size, names):
    """torch's ZeroRedundancyOptimizer + DDP on Gloo (the default group set up by run_ranks)."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    out = {}
    for name in names:
        model = _mlp()
        ddp = DistributedDataParallel(model)
        cls, options = OPTIMIZERS[name]
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=getattr(torch.optim, cls), **options)
        for step in range(STEPS):
            x, y = _batch(step, rank)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
        out[name] = _weights(model)
    return out


def test_zero1_equals_torch_zero_redundancy_optimizer_with_ddp():
    names = ["sgd_momentum", "adam", "adamw"]
    ours = run_ranks(_sharded_and_unsharded, 2, names, {}, init="accord", timeout=120)
    theirs = run_ranks(_torch_zero, 2, names, init="torch", timeout=120)
    for rank in range(2):
        for name in names:
            _assert_weights(ours[rank][name][0], theirs[rank][name], 1e-6, f"{name} on rank {rank}")


def _refusals(rank, size):
    """The message every rank gets for each bad construction (None: nothing raised)."""
    import torch

    import accord.torch as hvd

    def build(model, opt_cls=torch.optim.Adam, **kw):
        try:
            hvd.DistributedOptimizer(opt_cls(model.parameters()), named_parameters=model.named_parameters(),
                                     shard_optimizer_state=True, **kw)
        except ValueError as exc:
            return str(exc)
        return None

    hvd.init()
    try:
        wide = 7 if rank == 1 else 6
        seen = {
            "shape": build(torch.nn.Sequential(torch.nn.Linear(4, wide), torch.nn.Linear(wide, 2))),
            "count": build(torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(2 + (rank == 1))])),
            "dtype": build(torch.nn.Linear(3, 3).to(torch.float64 if rank == 1 else torch.float32)),
            "lbfgs": build(torch.nn.Linear(3, 3), torch.optim.LBFGS),
            "adasum": build(torch.nn.Linear(3, 3), op=hvd.Adasum),
        }
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(3, 3).parameters(), lr=0.1),
                                     shard_gradients=True)
        except ValueError as exc:
            seen["stage2 alone"] = str(exc)
        # order: the same tensors, named and listed in another order on rank 1
        a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
        pairs = [("a", a.weight), ("b", b.weight)]
        pairs = pairs[::-1] if rank == 1 else pairs
        try:
            hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in pairs], lr=0.1), named_parameters=pairs,
                                     shard_optimizer_state=True)
            seen["order"] = None
        except ValueError as exc:
            seen["order"] = str(exc)
        # and after all that, a good one still trains (the refusals left the engine usable)
        model = torch.nn.Linear(3, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), shard_optimizer_state=True)
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
        from accord.errors import BackendError

        try:  # (these ranks have no torch.distributed group: DTensors need one)
            opt.sharded_state_dict()
        except BackendError as exc:
            seen["dcp without a torch group"] = str(exc)
        return seen
    finally:
        hvd.shutdown()


def test_bad_input_is_refused_on_every_rank_naming_what_differs():
    results = run_ranks(_refusals, 2, init="accord", timeout=90)
    assert results[0] == results[1]  # the same error on every rank
    seen = results[0]
    assert "parameter #0 ('0.weight' on rank 0) has a different shape (rank 0: (6, 4), rank 1: (7, 4))" in seen["shape"]
    assert "number of parameters differs between ranks (rank 0: 4, rank 1: 6)" in seen["count"]
    assert "different dtype (rank 0: 'float32', rank 1: 'float64')" in seen["dtype"]
    assert "different name (rank 0: 'a', rank 1: 'b')" in seen["order"]
    assert "cannot shard LBFGS" in seen["lbfgs"]
    assert "op=Average and op=Sum, got ADASUM" in seen["adasum"]
    assert "shard_gradients=True needs shard_optimizer_state=True" in seen["stage2 alone"]
    assert "need a torch.distributed default process group" in seen["dcp without a torch group"]
    assert all("HINT:" in message for message in seen.values())


# (case, optimizer, options for both optimizers, options for the sharded one only, passes)
VARIANTS = [
    ("zero2", "adam", {}, {"shard_gradients": True}, 1),
    ("zero1_accumulate", "adam", {}, {}, 3),
    ("zero2_accumulate", "adamw", {}, {"shard_gradients": True}, 3),
    ("sum", "sgd_momentum", {"op": "Sum"}, {"shard_gradients": True}, 1),
    ("predivide", "adam", {"gradient_predivide_factor": 2.0}, {}, 1),
    ("fp16", "sgd_momentum", {"compression": "fp16"}, {}, 1),
    ("bf16", "sgd_momentum", {"compression": "bf16"}, {"shard_gradients": True}, 2),
]


def _variants(rank, size, variants, set_ranks):
    """Per case: (sharded weights, unsharded weights, every .grad None after backward)."""
    import accord.torch as hvd

    hvd.init()
    try:
        process_set = hvd.add_process_set(set_ranks) if set_ranks else hvd.global_process_set
        if not process_set.included():
            return None
        out = {}
        for case, name, common, only, passes in variants:
            common = dict(common)
            if "op" in common:
                common["op"] = getattr(hvd, common["op"])
            if "compression" in common:
                common["compression"] = getattr(hvd.Compression, common["compression"])
            plain, sharded = _mlp(), _mlp()
            ref = hvd.DistributedOptimizer(_make(name, plain.parameters()), named_parameters=plain.named_parameters(),
                                           backward_passes_per_step=passes, process_set=process_set, **common)
            opt = hvd.DistributedOptimizer(_make(name, sharded.parameters()),
                                           named_parameters=sharded.named_parameters(),
                                           backward_passes_per_step=passes, process_set=process_set,
                                           shard_optimizer_state=True, bucket_cap_mb=TINY_BUCKETS, **common, **only)
            dropped = []
            for step in range(20):
                for micro in range(passes):
                    import torch

                    x, y = _batch(step * passes + micro, rank)
                    torch.nn.functional.mse_loss(sharded(x), y).backward()
                    torch.nn.functional.mse_loss(plain(x), y).backward()
                dropped.append(all(p.grad is None for p in sharded.parameters()))
                opt.step()
                ref.step()
                opt.zero_grad()
                ref.zero_grad()
            out[case] = (_weights(sharded), _weights(plain), all(dropped))
            ref.remove_hooks()
            opt.remove_hooks()
        return out
    finally:
        if set_ranks:
            hvd.barrier()  # a rank outside the set waits for the members before shutting down
        hvd.shutdown()


def _check_variants(per_rank):
    tolerance = {"fp16": 1e-3, "bf16": 1e-2}  # the wire rounds; the two paths sum in other orders
    for rank, cases in enumerate(per_rank):
        for case, *_ in VARIANTS:
            sharded, plain, dropped = cases[case]
            _assert_weights(sharded, plain, tolerance.get(case, 1e-6), f"{case} on rank {rank}")
            _assert_weights(sharded, per_rank[0][case][0], 0.0, f"{case}: rank {rank} vs rank 0")
            assert dropped == ("shard_gradients" in VARIANTS_ONLY[case]), case  # stage 2 keeps no p.grad


VARIANTS_ONLY = {case: only for case, _, _, only, _ in VARIANTS}


def test_zero2_accumulation_ops_and_compression_equal_the_unsharded_optimizer():
    _check_variants(run_ranks(_variants, 3, VARIANTS, None, init="accord", timeout=200))


def test_sharding_within_a_process_set():
    results = run_ranks(_variants, 3, VARIANTS[:3], [0, 2], init="accord", timeout=200)
    assert results[1] is None
    _check_variants_subset([results[0], results[2]], VARIANTS[:3])


def _check_variants_subset(per_rank, variants):
    for rank, cases in enumerate(per_rank):
        for case, *_ in variants:
            sharded, plain, _ = cases[case]
            _assert_weights(sharded, plain, 1e-6, f"{case} on member {rank}")


def _numpy_state(state):
    """A state dict with numpy arrays for tensors (torch tensors cross process queues as shared
    file descriptors, which the finished rank no longer serves)."""
    return {"state": {i: {k: v.numpy().copy() if hasattr(v, "numpy") else v for k, v in entry.items()}
                      for i, entry in state["state"].items()},
            "param_groups": state["param_groups"]}


def _save(rank, size, path):
    """10 sharded Adam steps; returns (the unsharded optimizer's state after the same 10 steps,
    the weights after an 11th sharded step); rank 0 saves weights and consolidated state."""
    import torch

    import accord.torch as hvd

    hvd.init()
    try:
        plain, model = _mlp(), _mlp()
        ref = hvd.DistributedOptimizer(_make("adam", plain.parameters()), named_parameters=plain.named_parameters())
        opt = hvd.DistributedOptimizer(_make("adam", model.parameters()), named_parameters=model.named_parameters(),
                                       shard_optimizer_state=True, bucket_cap_mb=TINY_BUCKETS)
        _train(model, opt, rank, steps=10)
        _train(plain, ref, rank, steps=10)
        state = opt.state_dict()  # every rank calls it (a collective)
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": state}, path)
        x, y = _batch(10, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        return _numpy_state(state), _numpy_state(ref.state_dict()), _weights(model)
    finally:
        hvd.shutdown()


def _resume(rank, size, path):
    """Load the checkpoint into a sharded optimizer at this world size and take one step; also
    the same step by plain torch.optim.Adam in this process, over every rank's batch."""
    import torch

    import accord.torch as hvd

    hvd.init()
    try:
        saved = torch.load(path, weights_only=True)
        model = _mlp(seed=1 + rank)  # every rank starts elsewhere: the checkpoint must set it all
        model.load_state_dict(saved["model"])
        opt = hvd.DistributedOptimizer(_make("adam", model.parameters()), named_parameters=model.named_parameters(),
                                       shard_optimizer_state=True, bucket_cap_mb=TINY_BUCKETS / 3)
        opt.load_state_dict(saved["optimizer"])
        x, y = _batch(10, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        reference = _mlp()
        reference.load_state_dict(saved["model"])
        plain = _make("adam", reference.parameters())
        plain.load_state_dict(saved["optimizer"])
        losses = [torch.nn.functional.mse_loss(reference(xr), yr) for xr, yr in (_batch(10, r) for r in range(size))]
        (sum(losses) / size).backward()
        plain.step()
        return _weights(model), _weights(reference)
    finally:
        hvd.shutdown()


def test_consolidated_state_saved_at_2_ranks_resumes_at_1_3_and_4(tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    saved = run_ranks(_save, 2, path, init="accord", timeout=120)
    sharded_state, plain_state, _ = saved[0]
    # the consolidated state is the unsharded optimizer's, key for key and bit for bit
    assert sharded_state["param_groups"] == plain_state["param_groups"]
    assert sorted(sharded_state["state"]) == sorted(plain_state["state"]) == list(range(6))
    for index, entry in plain_state["state"].items():
        assert sorted(entry) == sorted(sharded_state["state"][index])
        for key, value in entry.items():
            assert np.array_equal(value, sharded_state["state"][index][key]), (index, key)
    assert saved[1][0]["state"].keys() == sharded_state["state"].keys()  # every rank gets it all
    for size in (1, 3, 4):
        for rank, (resumed, reference) in enumerate(run_ranks(_resume, size, path, init="accord", timeout=120)):
            _assert_weights(resumed, reference, 1e-6, f"resumed at {size} ranks, rank {rank}")
    # at the saving world size, resuming is the uninterrupted run's next step
    resumed = run_ranks(_resume, 2, path, init="accord", timeout=120)
    _assert_weights(resumed[0][0], saved[0][2], 0.0, "resumed at 2 ranks vs uninterrupted")


def _broadcasts(rank, size):
    """Every rank starts from its own weights; root's parameters and (loaded) optimizer state are
    broadcast. Returns (sharded weights, unsharded weights) after 5 more steps, and the state
    each rank holds right after the broadcast (consolidated)."""

    import accord.torch as hvd

    hvd.init()
    try:
        # a state for root to load: 3 steps of plain Adam on one process
        donor = _mlp()
        donor_opt = _make("adam", donor.parameters())
        _train(donor, donor_opt, rank=0, steps=3)
        donor_state = _numpy_state(donor_opt.state_dict())  # (torch's load shares 'step' tensors)
        out = []
        for sharded in (True, False):
            model = _mlp(seed=10 + rank)
            kw = {"shard_optimizer_state": True, "bucket_cap_mb": TINY_BUCKETS} if sharded else {}
            opt = hvd.DistributedOptimizer(_make("adam", model.parameters()),
                                           named_parameters=model.named_parameters(), **kw)
            if rank == 0:
                model.load_state_dict(donor.state_dict())
                opt.load_state_dict(copy.deepcopy(donor_opt.state_dict()))
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            state = _numpy_state(opt.state_dict()) if sharded else None
            out.append((_train(model, opt, rank, steps=5), state))
            opt.remove_hooks()
        return out[0][0], out[1][0], out[0][1], donor_state
    finally:
        hvd.shutdown()


def test_broadcast_parameters_and_optimizer_state_into_a_sharded_optimizer():
    for rank, (sharded, plain, state, donor) in enumerate(run_ranks(_broadcasts, 3, init="accord", timeout=120)):
        _assert_weights(sharded, plain, 1e-6, f"rank {rank}")
        for index, entry in donor["state"].items():
            for key, value in entry.items():
                assert np.array_equal(state["state"][index][key], value), (rank, index, key)


def _elastic_sharded(rank, size, stage2):
    """hvd.elastic.run with a sharded Adam; rank 2 dies (no goodbye) before its step 2."""
    import os

    import torch.distributed as dist

    import accord.torch as hvd

    dist.destroy_process_group()  # the death harness gives every rank a torch group; accord builds its own
    hvd.init()
    model = _mlp()
    opt = hvd.DistributedOptimizer(_make("adam", model.parameters()), named_parameters=model.named_parameters(),
                                   shard_optimizer_state=True, shard_gradients=stage2, bucket_cap_mb=TINY_BUCKETS)
    state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])

    @hvd.elastic.run
    def train(state):
        while state.step < 5:
            if hvd.rank() == 2 and state.step == 2:
                os._exit(17)
            _train(state.model, state.optimizer, hvd.rank(), steps=1, first=state.step)
            state.sizes.append(hvd.size())
            state.step += 1
            state.commit()

    train(state)
    out = {"sizes": state.sizes, "weights": _weights(model), "world": opt._world}
    hvd.shutdown()
    return out


def _reference_with_sizes(sizes):
    """Plain Adam in one process, each step's gradient the mean over that step's ranks."""
    import torch

    model = _mlp()
    opt = _make("adam", model.parameters())
    for step, n in enumerate(sizes):
        losses = [torch.nn.functional.mse_loss(model(x), y) for x, y in (_batch(step, r) for r in range(n))]
        (sum(losses) / n).backward()
        opt.step()
        opt.zero_grad()
    return _weights(model)


@pytest.mark.parametrize("stage2", [False, True])
def test_elastic_sharded_optimizer_reshards_from_the_last_commit(stage2, monkeypatch, tmp_path):
    from helpers.dying_ranks import run_ranks_with_deaths
    from helpers.ranks import _start_accord_store

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # (torch's first optimizer sets it)
    server, env = _start_accord_store()
    env.update({"ACCORD_COLLECTIVE_TIMEOUT": "10", "ACCORD_ELASTIC_TIMEOUT": "30"})
    try:
        results = run_ranks_with_deaths(_elastic_sharded, 3, {2}, stage2, env=env, timeout=150)
    finally:
        server.close()
    sizes = [3, 3, 2, 2, 2]  # steps 0 and 1 committed at 3 workers, the rest at 2
    assert sorted(results) == [0, 1]
    for rank, out in results.items():
        assert out["sizes"] == sizes and out["world"] == 2
        _assert_weights(out["weights"], _reference_with_sizes(sizes), 1e-6, f"survivor {rank}")


def _fit(rank, size, tmp):
    """Model.fit with a sharded Adam and with Model's own (unsharded) wrapping; checkpoints
    written on the way (every rank calls save: the state is consolidated) load back."""
    import os

    import torch
    from helpers.small_nets import _data, _net

    import accord
    import accord.torch as hvd

    hvd.init()
    x, y = _data(40, 0)
    out = {}
    for sharded in (True, False):
        model = accord.Model(_net(seed=rank))  # rank 0's weights are broadcast by prepare
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        if sharded:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.network.named_parameters(),
                                           shard_optimizer_state=True, bucket_cap_mb=0.0005)
        model.prepare(opt, torch.nn.CrossEntropyLoss())
        model.fit((x, y), batch_size=4, epochs=2, verbose=0, save_dir=os.path.join(tmp, str(sharded)))
        out[sharded] = ([p.detach().numpy().copy() for p in model.network.parameters()],
                        _numpy_state(model.optimizer.state_dict()))
    # a checkpoint of the sharded run resumes into another sharded optimizer
    restored = accord.Model(_net(seed=7 + rank))
    opt = hvd.DistributedOptimizer(torch.optim.Adam(restored.parameters(), lr=0.01),
                                   named_parameters=restored.network.named_parameters(),
                                   shard_optimizer_state=True)
    restored.prepare(opt, torch.nn.CrossEntropyLoss())
    restored.load(os.path.join(tmp, "True", "final"))
    out["restored"] = _numpy_state(restored.optimizer.state_dict())
    hvd.shutdown()
    return out


def test_model_fit_with_a_sharded_optimizer(tmp_path):
    for rank, out in enumerate(run_ranks(_fit, 2, str(tmp_path), init="accord", timeout=150)):
        (sharded, state), (plain, plain_state) = out[True], out[False]
        _assert_weights(sharded, plain, 1e-9, f"rank {rank}")
        for which in (state, out["restored"]):
            for index, entry in plain_state["state"].items():
                for key, value in entry.items():
                    np.testing.assert_allclose(which["state"][index][key], value, rtol=1e-9, atol=1e-12)


def _scaled_and_clipped(rank, size):
    """GradScaler('cpu') and clipping by the global norm, sharded (ZeRO-1) and unsharded: the
    same weights, scales and norms. At step 3 rank 0 alone gets an inf in the last bias (an
    element rank 0 owns): every rank must skip that step."""
    import torch

    import accord.torch as hvd

    hvd.init()
    try:
        out = {}
        for name, sharded in itertools.product(("adam", "adam_fused"), (True, False)):
            model = _mlp()
            kw = {"shard_optimizer_state": True, "bucket_cap_mb": TINY_BUCKETS} if sharded else {}
            opt = hvd.DistributedOptimizer(_make(name, model.parameters()), named_parameters=model.named_parameters(),
                                           **kw)
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
            scales, norms = [], []
            for step in range(10):
                x, y = _batch(step, rank)
                if step == 3 and rank == 0:
                    model[-1].bias.register_hook(lambda g: g + torch.tensor([float("inf"), 0.0, 0.0]))
                scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
                if step == 3 and rank == 0:
                    model[-1].bias._backward_hooks.clear()
                opt.synchronize()
                scaler.unscale_(opt)
                if sharded:
                    norms.append(float(opt.clip_grad_norm_(0.5)))
                else:
                    norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
                with opt.skip_synchronize():
                    scaler.step(opt)
                scaler.update()
                scales.append(scaler.get_scale())
                opt.zero_grad()
            out[name, sharded] = (_weights(model), scales, norms)
            opt.remove_hooks()
        out["stage2"] = _grad_scaler_with_stage2(rank)
        return out
    finally:
        hvd.shutdown()


def _grad_scaler_with_stage2(rank):
    """A GradScaler stepping a ZeRO-2 optimizer, with and without unscale_ first: what each
    step raises, the weights right after (unchanged?), and after a plain step that follows."""
    import torch

    import accord.torch as hvd
    from accord.errors import ConfigError

    model = _mlp()
    start = _weights(model)
    opt = hvd.DistributedOptimizer(_make("adam", model.parameters()), named_parameters=model.named_parameters(),
                                   shard_optimizer_state=True, shard_gradients=True, bucket_cap_mb=TINY_BUCKETS)
    out = {"start": start, "errors": []}
    for step, unscale_first in enumerate((False, True)):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        x, y = _batch(step, rank)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        try:
            if unscale_first:
                opt.synchronize()
                scaler.unscale_(opt)
                with opt.skip_synchronize():
                    scaler.step(opt)
            else:
                scaler.step(opt)
        except ConfigError as exc:
            out["errors"].append(str(exc))
        opt.zero_grad()
    out["after refusals"] = _weights(model)
    x, y = _batch(2, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()  # (without a scaler the optimizer still works)
    out["after a plain step"] = _weights(model)
    opt.remove_hooks()
    return out


def test_grad_scaler_and_global_norm_clipping_match_the_unsharded_optimizer():
    results = run_ranks(_scaled_and_clipped, 2, init="accord", timeout=120)
    for rank, out in enumerate(results):
        for name in ("adam", "adam_fused"):  # (a fused step unscales and skips by the scaler's values)
            (weights, scales, norms), (plain, plain_scales, plain_norms) = out[name, True], out[name, False]
            assert scales == plain_scales and scales[3] == scales[2] / 2, name  # the inf step was skipped
            assert not np.isfinite(norms[3]) and not np.isfinite(plain_norms[3])
            np.testing.assert_allclose(norms[:3] + norms[4:], plain_norms[:3] + plain_norms[4:], rtol=1e-6)
            _assert_weights(weights, plain, 1e-6, f"{name} on rank {rank}")
            assert all(np.isfinite(w).all() for w in weights)
        # ZeRO-2 keeps no p.grad for a scaler to check: refused at its step, on every rank alike
        stage2 = out["stage2"]
        assert len(stage2["errors"]) == 2 and stage2["errors"][0] == stage2["errors"][1]
        assert "GradScaler cannot step a DistributedOptimizer with shard_gradients=True" in stage2["errors"][0]
        assert "HINT: use shard_gradients=False" in stage2["errors"][0]
        _assert_weights(stage2["after refusals"], stage2["start"], 0.0, f"refused steps left rank {rank}'s weights")
        _assert_weights(stage2["after a plain step"], results[0]["stage2"]["after a plain step"], 0.0, "ranks")
        assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(stage2["after a plain step"], stage2["start"]))


def _unused_branches(rank, size, stage2, passes):
    """A side layer that only some ranks use, in some passes (data-dependent graphs): ranks with
    no gradient for it send zeros, as the unsharded optimizer does."""
    import torch

    import accord.torch as hvd

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body, self.side = _mlp(), torch.nn.Linear(12, 3)

        def forward(self, x, side):
            return self.body(x) + self.side(x) if side else self.body(x)

    def spares(opt):  # (stage 2's pass buffers kept for the next pass, by storage)
        return sorted(t.untyped_storage().data_ptr() for t in getattr(getattr(opt, "_reuse", None), "spares", []))

    hvd.init()
    try:
        out = []
        for sharded in (True, False):
            model, seen = Net(), []
            kw = {"shard_optimizer_state": True, "shard_gradients": stage2,
                  "bucket_cap_mb": TINY_BUCKETS} if sharded else {}
            opt = hvd.DistributedOptimizer(_make("adam", model.parameters()), named_parameters=model.named_parameters(),
                                           backward_passes_per_step=passes, **kw)
            for step in range(8):
                for micro in range(passes):
                    x, y = _batch(step * passes + micro, rank)
                    side = rank == 1 and (step + micro) % 2 == 0
                    torch.nn.functional.mse_loss(model(x, side), y).backward()
                opt.step()
                opt.zero_grad()
                if sharded:
                    seen.append(spares(opt))
            out.append(_weights(model))
            if sharded:
                out.append((seen, len(opt._layout.buckets) * passes if stage2 else 0))
            opt.remove_hooks()
        return out
    finally:
        hvd.shutdown()


@pytest.mark.parametrize("stage2,passes", [(False, 1), (True, 1), (True, 2), (True, 3)])
def test_parameters_without_gradient_on_some_ranks(stage2, passes):
    for rank, (sharded, (seen, most), plain) in enumerate(run_ranks(_unused_branches, 2, stage2, passes,
                                                                    init="accord", timeout=90)):
        _assert_weights(sharded, plain, 1e-6, f"rank {rank}")
        # Stage 2 reuses its pass buffers (zeroed: a stale gradient would show in the weights
        # above, as the side layer has none in some passes) instead of allocating them each
        # step: once kept, a buffer stays, and no more are kept than can be in flight at once.
        assert all(set(a) <= set(b) for a, b in zip(seen, seen[1:])), seen
        assert 0 < len(seen[-1]) <= most if stage2 else seen[-1] == [], (seen[-1], most)


# --- torch.distributed.checkpoint: the per-rank sharded form --------------------------------------

def _scaled_mlp(seed=0):
    """The MLP times a learned 0-d scale (a parameter whose state DTensor is replicated)."""
    import torch

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _mlp(seed)
            self.scale = torch.nn.Parameter(torch.tensor(1.0))

        def forward(self, x):
            return self.body(x) * self.scale

    return Scaled()


def _dcp_save(rank, size, path):
    """10 sharded Adam steps on the accord torch.distributed backend, then ``dcp.save`` of the
    model and of the optimizer's sharded form; returns the consolidated state (numpy) and the
    type of one saved state value."""
    import torch.distributed.checkpoint as dcp

    import accord.torch as hvd

    hvd.init()
    try:
        model = _scaled_mlp()
        opt = hvd.DistributedOptimizer(_make("adam", model.parameters()), named_parameters=model.named_parameters(),
                                       shard_optimizer_state=True, bucket_cap_mb=TINY_BUCKETS)
        _train(model, opt, rank, steps=10)
        sharded = opt.sharded_state_dict()
        dcp.save({"model": model.state_dict(), "optim": sharded}, checkpoint_id=path)
        kinds = {name: str(sharded["state"][name]["exp_avg"].placements) for name in ("body.0.weight", "scale")}
        return _numpy_state(opt.state_dict()), kinds
    finally:
        hvd.shutdown()


def _dcp_resume(rank, size, path):
    """``dcp.load`` into a fresh model and a sharded optimizer at this world size (other buckets
    than the saving run's), one step; returns the weights after it and the consolidated state
    before it. At 1 rank the same checkpoint also goes into plain torch.optim.Adam through
    torch's own get/set_optimizer_state_dict, and a state dict naming another parameter is
    refused."""
    import torch
    import torch.distributed.checkpoint as dcp

    import accord.torch as hvd
    from accord.errors import ConfigError

    hvd.init()
    try:
        model = _scaled_mlp(seed=1 + rank)  # every rank starts elsewhere: the checkpoint must set it all
        opt = hvd.DistributedOptimizer(_make("adam", model.parameters()), named_parameters=model.named_parameters(),
                                       shard_optimizer_state=True, bucket_cap_mb=TINY_BUCKETS / 3,
                                       shard_gradients=size == 3)  # (ZeRO-2 loads the same state)
        state = {"model": model.state_dict(), "optim": opt.sharded_state_dict()}
        dcp.load(state, checkpoint_id=path)
        model.load_state_dict(state["model"])
        opt.load_sharded_state_dict(state["optim"])
        loaded = _numpy_state(opt.state_dict())
        x, y = _batch(10, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        # the expected weights, computed here (one thread, as the ranks' own matmuls)
        out = {"weights": _weights(model), "loaded": loaded,
               "expected": _reference_averaging_gradients([2] * 10 + [size])}
        if size == 1:
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

            plain_model = _scaled_mlp(seed=5)
            plain = _make("adam", plain_model.parameters())
            plain_state = {"model": plain_model.state_dict(), "optim": get_optimizer_state_dict(plain_model, plain)}
            dcp.load(plain_state, checkpoint_id=path)
            set_optimizer_state_dict(plain_model, plain, plain_state["optim"])
            torch.nn.functional.mse_loss(plain_model(x), y).backward()
            plain.step()
            out["plain"] = _weights(plain_model)
            renamed = opt.sharded_state_dict()
            renamed["state"]["extra"] = renamed["state"].pop("body.0.bias")
            try:
                opt.load_sharded_state_dict(renamed)
            except ConfigError as exc:
                out["renamed"] = str(exc)
        if size == 4:  # a process set's sharded optimizer has no DTensor form (its mesh is not every rank)
            pair = hvd.add_process_set([0, 1])
            if rank < 2:
                small = _mlp()
                partial = hvd.DistributedOptimizer(_make("adam", small.parameters()), process_set=pair,
                                                   named_parameters=small.named_parameters(),
                                                   shard_optimizer_state=True)
                try:
                    partial.sharded_state_dict()
                except ConfigError as exc:
                    out["process set"] = str(exc)
            hvd.barrier()
        return out
    finally:
        hvd.shutdown()


def _reference_averaging_gradients(sizes):
    """Plain Adam in one process, each step's gradient the mean of that step's ranks' own
    gradients (summed in rank order, as the ranks' reduction sums them): no rounding from
    another order accumulates over the steps."""
    import torch

    model = _scaled_mlp()
    opt = _make("adam", model.parameters())
    for step, n in enumerate(sizes):
        total = None
        for r in range(n):
            x, y = _batch(step, r)
            grads = torch.autograd.grad(torch.nn.functional.mse_loss(model(x), y), list(model.parameters()))
            total = list(grads) if total is None else [t + g for t, g in zip(total, grads)]
        for p, g in zip(model.parameters(), total):
            p.grad = g / n
        opt.step()
        opt.zero_grad()
    return _weights(model)


def test_dcp_sharded_state_saved_at_2_ranks_reshards_at_1_3_and_4(tmp_path):
    path = str(tmp_path / "dcp")
    saved = run_ranks(_dcp_save, 2, path, init="torch:accord", timeout=120)
    state, kinds = saved[0]
    assert kinds == {"body.0.weight": "(Shard(dim=0),)", "scale": "(Replicate(),)"}
    for size in (1, 3, 4):
        results = run_ranks(_dcp_resume, size, path, init="torch:accord", timeout=120)
        expected = results[0]["expected"]
        for rank, out in enumerate(results):
            # the loaded state is the saved one, bit for bit, whatever the new shards
            assert sorted(out["loaded"]["state"]) == sorted(state["state"]) == list(range(7))
            for index, entry in state["state"].items():
                assert sorted(entry) == sorted(out["loaded"]["state"][index])
                for key, value in entry.items():
                    assert np.array_equal(value, out["loaded"]["state"][index][key]), (size, rank, index, key)
            assert out["loaded"]["param_groups"] == state["param_groups"]
            _assert_weights(out["weights"], expected, 1e-6, f"resumed at {size} ranks, rank {rank}")
        if size == 4:
            for rank in (0, 1):
                assert "needs an optimizer sharded over every rank" in results[rank]["process set"]
                assert "(2 of 4 ranks)" in results[rank]["process set"] and "HINT:" in results[rank]["process set"]
        if size == 1:
            _assert_weights(results[0]["plain"], expected, 1e-6, "plain torch.optim.Adam from the DCP checkpoint")
            assert "state for parameters the optimizer does not have: ['extra']" in results[0]["renamed"]
            assert "HINT:" in results[0]["renamed"]
