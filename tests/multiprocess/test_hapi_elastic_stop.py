"""``fit(elastic=True)`` on 2 real ranks: a stop asked on one rank right before a re-formation
stops every rank after it.

Rank 1 asks to stop at epoch 0's end (as EarlyStopping does); rank 0 is told that a host was
removed, so epoch 0's commit re-forms the job. A removal only means no sync (the survivors keep
their own commits), so rank 0 learns of rank 1's stop only if the ranks agree on it when they
resume; otherwise the stop is lost and every rank trains all the epochs after the re-formation.
"""
import time

import pytest
from helpers.ranks import run_ranks
from helpers.small_nets import _data, _net

pytestmark = pytest.mark.timeout(120)

N, BATCH, EPOCHS = 16, 4, 4  # 2 steps per rank and epoch


def _fit(rank, size):
    import torch
    from torch import nn

    import accord
    import accord.torch as hvd
    from accord.hapi import Callback

    seen = []

    class StopBeforeReform(Callback):
        def on_train_begin(self, logs=None):
            seen.append("begin")

        def on_train_end(self, logs=None):
            seen.append("end")

        def on_epoch_begin(self, epoch, logs=None):
            seen.append(epoch)

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0 and "reformed" not in seen:
                seen.append("reformed")
                if rank == 1:
                    self.model.stop_training = True
                else:  # rank 0's view of host changes decides for every rank
                    self.model.elastic_state.on_hosts_updated(time.time(), "removed")

    model = accord.Model(_net(seed=0))
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    history = model.fit(_data(N, 0), batch_size=BATCH, epochs=EPOCHS, verbose=0, elastic=True,
                        callbacks=[StopBeforeReform()])
    out = {"seen": seen, "epochs": len(history.get("loss", [])),
           "commits": model.elastic_state.commits, "stop": bool(model.stop_training),
           "size": hvd.size()}
    hvd.shutdown()
    return out


def test_a_stop_on_one_rank_survives_a_reformation_without_sync():
    steps_per_epoch = N // 2 // BATCH
    for out in run_ranks(_fit, 2, init="accord", timeout=100):
        assert out["seen"] == ["begin", 0, "reformed", "begin", "end"], out
        assert out["epochs"] == 1 and out["stop"] and out["size"] == 2, out
        assert out["commits"] == steps_per_epoch, out  # no step trained after the re-formation
