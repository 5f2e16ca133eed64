"""Lightning Horovod training scripts, as Lightning 1.x ran them under horovodrun, run here under
``accordrun -np 2``: the one line added is ``import accord.lightning`` (Lightning 1.x knew
``strategy="horovod"`` itself). The cases are those of Lightning's own Horovod tests: a simple fit,
``accumulate_grad_batches``, gradient clipping by value and by norm, results reduced across
ranks, ``ModelCheckpoint`` writing once, final weights equal to one process trained on the global
batch, and uneven data; manual optimization; then the same on Lightning Fabric
(``Fabric(strategy="accord")``).

    python -m accord.run -np 2 python lightning_horovod.py OUT [CASE ...]

Each case writes ``OUT/CASE.RANK.json`` (framework_common.write); the tests compare with
framework_common.reference.
What is instrumented for the tests (not part of a user's script) is marked so.
"""
import os
import sys

import framework_common as common
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_fabric import Fabric
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import accord.lightning  # noqa: F401  (the line added for accord)

RANK = int(os.environ.get("RANK", "0"))
OUT = sys.argv[1]

# Instrumented for the tests: every checkpoint file written, by whom.
WRITES: list = []
_torch_io = sys.modules["lightning_fabric.plugins.io.torch_io"].TorchCheckpointIO
_save = _torch_io.save_checkpoint


def _recording_save(self, checkpoint, path, storage_options=None):
    WRITES.append(os.path.basename(str(path)))
    return _save(self, checkpoint, path, storage_options=storage_options)


_torch_io.save_checkpoint = _recording_save


class Regression(pl.LightningModule):
    def __init__(self, optimizer="sgd", lr=0.05, schedule=False):
        super().__init__()
        self.net = common.network(common.init_seed(RANK))  # each rank its own start
        self.optimizer, self.lr, self.schedule = optimizer, lr, schedule

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if self.schedule:
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.8 ** step)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        return optimizer


def loader(indices=None):
    x, y = common.data()
    if indices is not None:
        x, y = x[indices], y[indices]
    return DataLoader(TensorDataset(x, y), batch_size=common.BATCH)


def trainer(**options):
    settings = dict(strategy="horovod", accelerator="cpu", max_epochs=1, enable_progress_bar=False,
                    logger=False, enable_model_summary=False, enable_checkpointing=False,
                    default_root_dir=OUT, num_sanity_val_steps=0)
    settings.update(options)
    return pl.Trainer(**settings)


def finished(t, model, **extra):
    return {"finished": t.state.finished, "strategy": type(t.strategy).__name__,
            "weights": common.weights(model.net), "global_step": t.global_step, **extra}


def case_fit():
    model = Regression()
    t = trainer(max_epochs=2, gradient_clip_val=0.5, limit_val_batches=2)
    t.fit(model, loader(), loader())
    return finished(t, model, val_loss=float(t.callback_metrics["val_loss"]))


def case_accumulate():
    model = Regression()
    t = trainer(accumulate_grad_batches=2)
    t.fit(model, loader())
    return finished(t, model)


def case_clip_value():
    model = Regression()
    t = trainer(gradient_clip_val=0.05, gradient_clip_algorithm="value")
    t.fit(model, loader())
    return finished(t, model)


def case_schedule():
    model = Regression(schedule=True)
    t = trainer(max_epochs=2)
    t.fit(model, loader())
    return finished(t, model, lr=t.optimizers[0].param_groups[0]["lr"])


def case_adam():
    model = Regression(optimizer="adam", lr=0.01)
    t = trainer(strategy="accord", max_epochs=2)
    t.fit(model, loader())
    return finished(t, model)


class Manual(Regression):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        x, y = batch
        optimizer.zero_grad()
        self.manual_backward(F.mse_loss(self(x), y))
        self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        optimizer.step()


def case_manual():
    model = Manual()
    t = trainer()
    t.fit(model, loader())
    return finished(t, model)


class Results(Regression):
    """Lightning's test_result_reduce_horovod, and the strategy's other collectives."""

    def training_step(self, batch, batch_idx):
        rank = float(self.global_rank)
        self.log("summed", torch.tensor(1.0), sync_dist=True, reduce_fx="sum", on_step=True, on_epoch=True)
        self.log("rank_mean", torch.tensor(rank), sync_dist=True)
        self.log("rank_max", torch.tensor(rank), sync_dist=True, reduce_fx="max")
        self.seen_step = float(self.trainer._results["training_step.summed"].value)
        return super().training_step(batch, batch_idx)

    def on_train_end(self):
        strategy = self.trainer.strategy
        gathered = self.all_gather(torch.tensor([self.global_rank, 10 + self.global_rank]))
        x = torch.tensor(float(self.global_rank + 1), dtype=torch.float64, requires_grad=True)
        rows = strategy.all_gather(x, sync_grads=True)
        (rows * torch.tensor([1.0, 2.0], dtype=torch.float64)).sum().backward()
        self.checks = {
            "gathered": gathered.tolist(),
            "gathered_rows": rows.tolist(),
            "gather_grad": float(x.grad),
            "broadcast": strategy.broadcast(f"from rank {self.global_rank}", src=1),
            "any": strategy.reduce_boolean_decision(self.global_rank == 0, all=False),
            "all": strategy.reduce_boolean_decision(self.global_rank == 0, all=True),
            "sum": strategy.reduce(torch.tensor(self.global_rank + 1), reduce_op="sum").item(),
            "mean_int": strategy.reduce(torch.tensor(self.global_rank * 3)).item(),
            "not_a_tensor": strategy.reduce("text"),
            "group_refused": refused(lambda: strategy.reduce(torch.tensor(1.0), group=object())),
            "op_refused": refused(lambda: strategy.reduce(torch.tensor(1), reduce_op="band")),
        }
        strategy.barrier("results")


def refused(call):
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


def case_results():
    model = Results()
    t = trainer(limit_train_batches=2, log_every_n_steps=1)
    t.fit(model, loader())
    metrics = {k: float(v) for k, v in t.callback_metrics.items()}
    return finished(t, model, metrics=metrics, seen_step=model.seen_step, checks=model.checks)


def case_checkpoint():
    model = Regression()
    folder = os.path.join(OUT, "checkpoints")
    WRITES.clear()
    t = trainer(max_epochs=2, enable_checkpointing=True,
                callbacks=[ModelCheckpoint(dirpath=folder, save_top_k=-1, every_n_epochs=1)])
    t.fit(model, loader())
    t.strategy.barrier()
    files = sorted(os.listdir(folder))
    last = torch.load(os.path.join(folder, files[-1]), weights_only=False)["state_dict"]
    return finished(t, model, writes=list(WRITES), files=files,
                    saved={k[len("net."):]: v.flatten().tolist() for k, v in last.items()})


class Normalized(Regression):
    def __init__(self):
        super().__init__()
        torch.manual_seed(common.init_seed(RANK))
        features = common.FEATURES
        self.net = torch.nn.Sequential(torch.nn.BatchNorm1d(features), torch.nn.Linear(features, 1)).double()


def case_sync_batchnorm():
    model = Normalized()
    t = trainer(sync_batchnorm=True)
    t.fit(model, loader())
    norm = model.net[0]
    return finished(t, model, kind=type(norm).__module__ + "." + type(norm).__name__,
                    running_mean=norm.running_mean.tolist(), running_var=norm.running_var.tolist())


def case_uneven():
    # Rank 0 has 3 batches an epoch, rank 1 has 2 (no DistributedSampler); validation is uneven too.
    train = [list(range(0, 12)), list(range(12, 20))][RANK]
    val = [list(range(20, 32)), list(range(32, 36))][RANK]
    model = Regression()
    t = trainer(max_epochs=2, use_distributed_sampler=False)
    t.fit(model, loader(train), loader(val))
    return finished(t, model, val_loss=float(t.callback_metrics["val_loss"]))


def case_fabric_uneven():
    # Rank 0 has 3 batches, rank 1 has 2; each calls join() when its data ends.
    fabric = Fabric(strategy="accord", accelerator="cpu")
    fabric.launch()
    model = common.network(common.init_seed(fabric.global_rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    train = loader([list(range(0, 12)), list(range(12, 20))][fabric.global_rank])
    for _ in range(2):
        for x, y in train:
            fabric.backward(F.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            fabric.log("loss", fabric.all_reduce(torch.tensor(1.0), reduce_op="sum"))
        fabric.strategy.join()
    total = fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()
    return {"weights": common.weights(model.module), "total": total}


def case_fabric():
    fabric = Fabric(strategy="accord", accelerator="cpu")
    fabric.launch()
    model = common.network(common.init_seed(fabric.global_rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    train = fabric.setup_dataloaders(loader())
    accumulate, last = 2, len(train) - 1
    WRITES.clear()
    for i, (x, y) in enumerate(train):
        stepping = (i + 1) % accumulate == 0 or i == last
        with fabric.no_backward_sync(model, enabled=not stepping):
            fabric.backward(F.mse_loss(model(x), y) / accumulate)
        if stepping:
            fabric.clip_gradients(model, optimizer, max_norm=0.3)
            optimizer.step()
            optimizer.zero_grad()
    fabric.save(os.path.join(OUT, "fabric.ckpt"), {"model": model})
    rank = fabric.global_rank
    checks = {
        "world": fabric.world_size, "strategy": type(fabric.strategy).__name__,
        "mean": fabric.all_reduce(torch.tensor(float(rank))).item(),
        "sum": fabric.all_reduce(torch.tensor(rank + 1), reduce_op="sum").item(),
        "gathered": fabric.all_gather(torch.tensor([rank])).tolist(),
        "broadcast": fabric.broadcast({"from": rank}, src=1),
        "batches": len(train),  # this rank's share: 20 of the 40 samples
    }
    fabric.barrier()
    return {"weights": common.weights(model.module), "writes": list(WRITES), "checks": checks}


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    for name in sys.argv[2:] or list(CASES):
        common.write(OUT, name, RANK, CASES[name]())
