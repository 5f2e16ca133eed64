"""The same strategies through the ``lightning`` package (``import lightning as L``) rather than
``pytorch_lightning``: ``L.Trainer(strategy="horovod")`` and ``L.Fabric(strategy="accord")``.

    python -m accord.run -np 2 python lightning_unified.py OUT

Writes ``OUT/unified_trainer.RANK.json`` and ``OUT/unified_fabric.RANK.json``.
"""
import os
import sys

import framework_common as common
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import accord.lightning  # noqa: F401  (the line added for accord)

RANK = int(os.environ.get("RANK", "0"))
OUT = sys.argv[1]


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = common.network(common.init_seed(RANK))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def loader():
    return DataLoader(TensorDataset(*common.data()), batch_size=common.BATCH)


model = Regression()
trainer = L.Trainer(strategy="horovod", accelerator="cpu", max_epochs=1, accumulate_grad_batches=2,
                    gradient_clip_val=0.5, enable_progress_bar=False, logger=False, enable_model_summary=False,
                    enable_checkpointing=False, default_root_dir=OUT)
trainer.fit(model, loader())
common.write(OUT, "unified_trainer", RANK, {"weights": common.weights(model.net),
                                            "strategy": type(trainer.strategy).__module__})

fabric = L.Fabric(strategy="accord", accelerator="cpu")
fabric.launch()
net = common.network(common.init_seed(RANK))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
net, optimizer = fabric.setup(net, optimizer)
for x, y in fabric.setup_dataloaders(loader()):
    fabric.backward(F.mse_loss(net(x), y))
    fabric.clip_gradients(net, optimizer, clip_val=0.05)
    optimizer.step()
    optimizer.zero_grad()
common.write(OUT, "unified_fabric", RANK, {"weights": common.weights(net.module),
                                           "strategy": type(fabric.strategy).__module__})
