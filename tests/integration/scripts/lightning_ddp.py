"""Lightning's own DDP on the accord torch.distributed backend: the Trainer with
``DDPStrategy(process_group_backend="accord")``, Fabric with ``strategy="ddp_accord"`` and with
Fabric's ``DDPStrategy(process_group_backend="accord")``. Started by accordrun or by torchrun:

    python -m accord.run -np 2 python lightning_ddp.py OUT [CASE ...]
    torchrun --nproc-per-node 2 lightning_ddp.py OUT [CASE ...]

The backend needs no import of accord (torch's entry point finds it); ``import accord.lightning``
is there for the name ``"ddp_accord"``. Each case writes ``OUT/CASE.RANK.json``.
"""
import os
import sys

import framework_common as common
import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning_fabric import Fabric
from lightning_fabric.strategies import DDPStrategy as FabricDDPStrategy
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import accord.lightning  # noqa: F401  (registers "ddp_accord")

RANK = int(os.environ.get("RANK", "0"))
OUT = sys.argv[1]


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = common.network(common.init_seed(RANK))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def loader():
    return DataLoader(TensorDataset(*common.data()), batch_size=common.BATCH)


def case_trainer():
    model = Regression()
    t = pl.Trainer(strategy=DDPStrategy(process_group_backend="accord"), accelerator="cpu", devices=2,
                   max_epochs=2, accumulate_grad_batches=2, gradient_clip_val=0.5, enable_progress_bar=False,
                   logger=False, enable_model_summary=False, enable_checkpointing=False, default_root_dir=OUT)
    t.fit(model, loader())
    registered = pl.strategies.StrategyRegistry.get("ddp_accord")
    return {"weights": common.weights(model.net), "backend": dist.get_backend(), "world": t.world_size,
            "train_loss": float(t.callback_metrics["train_loss"]),
            "registered": [type(registered).__name__, registered.process_group_backend]}


def fabric_fit(strategy):
    fabric = Fabric(strategy=strategy, accelerator="cpu", devices=2)
    fabric.launch()
    model = common.network(common.init_seed(fabric.global_rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    train = fabric.setup_dataloaders(loader())
    accumulate, last = 2, len(train) - 1
    for i, (x, y) in enumerate(train):
        stepping = (i + 1) % accumulate == 0 or i == last
        with fabric.no_backward_sync(model, enabled=not stepping):
            fabric.backward(F.mse_loss(model(x), y) / accumulate)
        if stepping:
            fabric.clip_gradients(model, optimizer, max_norm=0.3)
            optimizer.step()
            optimizer.zero_grad()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum").item()
    return {"weights": common.weights(model.module), "backend": dist.get_backend(), "world": fabric.world_size,
            "sum": total, "strategy": type(fabric.strategy).__name__}


def case_fabric_name():
    return fabric_fit("ddp_accord")


def case_fabric_object():
    return fabric_fit(FabricDDPStrategy(process_group_backend="accord"))


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    for name in sys.argv[2:] or list(CASES):
        common.write(OUT, name, RANK, CASES[name]())
    if dist.is_initialized():
        dist.destroy_process_group()
