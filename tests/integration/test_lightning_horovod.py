"""Lightning 1.x Horovod scripts (``Trainer(strategy="horovod")``) and Fabric (``strategy="accord"``)
under ``accordrun -np 2``, the import of accord.lightning their only change: the cases of
Lightning's own Horovod tests, each checked against one process trained with plain torch on the
global batch (scripts/framework_common.py's reference).

One job runs every case (scripts/lightning_horovod.py): Lightning takes seconds to import, and the
machine's cores are few. Ranks start from different weights, so equal results also show that
rank 0's weights reached every rank.
"""
import pytest
import torch
from helpers import framework_jobs as jobs

jobs.require("pytorch_lightning", "pip install 'accord[lightning]'")

common = jobs.common()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# float64 training: a 2-rank run and the reference differ only in the order of a few additions
TOL = 1e-10


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lightning-horovod")
    jobs.succeeded(jobs.accordrun("lightning_horovod.py", str(folder), timeout=540))
    return str(folder)


def sgd(lr):
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


def check(out, case, expected):
    """Both ranks finished with the same weights, within TOL of ``expected``; returns the results."""
    results = common.read(out, case)
    assert results[0]["weights"] == results[1]["weights"]
    assert jobs.max_difference(results[0]["weights"], expected) < TOL
    return results


def test_simple_fit_with_validation_and_clipping_by_norm(out):
    # strategy="horovod" multiplies the learning rate (0.05) by the 2 ranks, as Lightning 1.x did
    expected = common.reference(common.plan(2), sgd(0.1), clip=("norm", 0.5))
    assert jobs.max_difference(expected, common.reference(common.plan(2), sgd(0.1))) > 0.01  # the clip bites
    results = check(out, "fit", expected)
    for result in results:
        assert result["finished"] and result["strategy"] == "AccordStrategy" and result["global_step"] == 10
    assert results[0]["val_loss"] == results[1]["val_loss"]


def test_accumulate_grad_batches(out):
    # 5 batches per rank: steps after batches 2, 4 and the epoch's last one
    expected = common.reference(common.plan(1, accumulate=2), sgd(0.1), accumulate=2)
    results = check(out, "accumulate", expected)
    assert [r["global_step"] for r in results] == [3, 3]


def test_clip_grad_by_value(out):
    expected = common.reference(common.plan(1), sgd(0.1), clip=("value", 0.05))
    assert jobs.max_difference(expected, common.reference(common.plan(1), sgd(0.1))) > 0.01
    check(out, "clip_value", expected)


def test_scheduler_base_rates_are_scaled_with_the_learning_rate(out):
    # LambdaLR computes each rate from base_lrs: unscaled, the rate would fall back to 0.05 * 0.8**step
    def schedule(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.8 ** step)

    results = check(out, "schedule", common.reference(common.plan(2), sgd(0.1), schedule=schedule))
    assert results[0]["lr"] == pytest.approx(0.1 * 0.8 ** 10)


def test_accord_strategy_keeps_the_learning_rate_and_adam_starts_fresh(out):
    # strategy="accord" leaves lr as written (as DDP does); Adam's first step is its first
    check(out, "adam", common.reference(common.plan(2), lambda params: torch.optim.Adam(params, lr=0.01)))


def test_manual_optimization_with_clipping(out):
    check(out, "manual", common.reference(common.plan(1), sgd(0.1), clip=("norm", 0.5)))


def test_results_are_reduced_across_ranks(out):
    for rank, result in enumerate(common.read(out, "results")):
        metrics, checks = result["metrics"], result["checks"]
        assert result["seen_step"] == 2.0  # 1.0 logged by each rank, summed, while training
        assert metrics["summed_step"] == 2.0 and metrics["summed_epoch"] == 4.0  # 2 steps x 2 ranks
        assert metrics["rank_mean"] == 0.5 and metrics["rank_max"] == 1.0
        assert checks["gathered"] == [[0, 10], [1, 11]]  # stacked, as DDP's all_gather
        assert checks["gathered_rows"] == [1.0, 2.0]
        assert checks["gather_grad"] == 2.0 * (rank + 1)  # d/dx of 1*x0 + 2*x1, summed over 2 ranks
        assert checks["broadcast"] == "from rank 1"
        assert checks["any"] is True and checks["all"] is False
        assert checks["sum"] == 3 and checks["mean_int"] == 1  # (0 + 3) / 2, truncated as DDP does
        assert checks["not_a_tensor"] == "text"
        assert "sub-group" in checks["group_refused"] and "\nHINT: " in checks["group_refused"]
        assert "reduce_op='band'" in checks["op_refused"] and "\nHINT: " in checks["op_refused"]


def test_model_checkpoint_writes_each_file_once_on_rank_0(out):
    results = common.read(out, "checkpoint")
    assert results[0]["files"] == ["epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt"]
    assert results[0]["writes"] == results[0]["files"] and results[1]["writes"] == []
    expected = common.reference(common.plan(2), sgd(0.1))
    assert jobs.max_difference(results[0]["saved"], expected) < TOL  # the last file holds the final weights
    check(out, "checkpoint", expected)


def test_sync_batchnorm_uses_accords_sync_batch_norm(out):
    # the BatchNorm sees the inputs, so its statistics are those of each step's global batch
    x, _ = common.data()
    mean, var = torch.zeros(common.FEATURES, dtype=torch.float64), torch.ones(common.FEATURES, dtype=torch.float64)
    for step in common.plan(1):
        batch = x[[i for indices in step[0] for i in indices]]
        mean = 0.9 * mean + 0.1 * batch.mean(0)
        var = 0.9 * var + 0.1 * batch.var(0, unbiased=True)
    for result in common.read(out, "sync_batchnorm"):
        assert result["kind"] == "accord.torch.sync_batch_norm.SyncBatchNorm"
        assert jobs.max_difference({"mean": result["running_mean"], "var": result["running_var"]},
                                   {"mean": mean.tolist(), "var": var.tolist()}) < TOL


def test_uneven_data_ends_without_hang_and_ranks_agree(out):
    # rank 0 has 3 batches an epoch, rank 1 has 2: rank 1 joins and adds zeros to rank 0's third
    # step (the average still divides by 2), then takes rank 0's weights and optimizer state
    b0 = [list(range(0, 4)), list(range(4, 8)), list(range(8, 12))]
    b1 = [list(range(12, 16)), list(range(16, 20)), None]
    plan = [[[b0[i], b1[i]]] for i in range(3)] * 2
    results = check(out, "uneven", common.reference(plan, sgd(0.1)))
    assert [r["finished"] for r in results] == [True, True]
    assert results[0]["val_loss"] == results[1]["val_loss"]  # validation after each epoch, together
    assert [r["global_step"] for r in results] == [6, 4]  # each rank counts its own steps


def test_fabric_accumulation_clipping_collectives_and_save(out):
    expected = common.reference(common.plan(1, accumulate=2, shuffle=False), sgd(0.1), accumulate=2,
                                clip=("norm", 0.3))
    results = check(out, "fabric", expected)
    assert results[0]["writes"] == ["fabric.ckpt"] and results[1]["writes"] == []
    for result in results:
        assert result["checks"] == {"world": 2, "strategy": "AccordFabricStrategy", "mean": 0.5, "sum": 3,
                                    "gathered": [[0], [1]], "broadcast": {"from": 1}, "batches": 5}


def test_fabric_uneven_data_with_join(out):
    b0 = [list(range(0, 4)), list(range(4, 8)), list(range(8, 12))]
    b1 = [list(range(12, 16)), list(range(16, 20)), None]
    results = check(out, "fabric_uneven", common.reference([[[b0[i], b1[i]]] for i in range(3)] * 2, sgd(0.1)))
    assert [r["total"] for r in results] == [2.0, 2.0]  # collectives pair up after the joins
