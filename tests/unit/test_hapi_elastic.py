"""``Model.fit(elastic=True)`` in one process: the same callbacks as without elastic (train
begin/end with ``epochs=0``), and a stop asked right before a re-formation survives it.

A re-formation is triggered the way accordrun's driver does it: ``state.on_hosts_updated`` makes
the next commit raise ``HostsUpdatedInterrupt``; ``hvd.elastic.run`` then shuts accord down,
starts it again (alone: no launcher store, the same single rank) and calls ``fit``'s loop again.
"""
import time

import numpy as np
import pytest
import torch
from torch import nn

from accord.hapi import Callback, Model

pytestmark = pytest.mark.timeout(60)

N, BATCH = 12, 4  # 3 steps per epoch


@pytest.fixture(autouse=True)
def alone():
    """hvd.elastic.run initialises accord here: leave it as found (no engine threads)."""
    import accord.torch as hvd

    was = hvd.is_initialized()
    yield
    if hvd.is_initialized() and not was:
        hvd.shutdown()


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 5)), rng.integers(0, 3, size=N)


def _model():
    torch.manual_seed(0)
    model = Model(nn.Sequential(nn.Linear(5, 3)).double())
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    return model


class Record(Callback):
    """Records the hooks; ``stop_at`` (epoch, step or None for the epoch end) asks to stop and
    announces a host change there, so the commit that follows re-forms the job."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.seen = []
        self.steps = 0
        self.stop_at = stop_at
        self.epoch = None

    def _stop_here(self):
        self.stop_at = None  # once: after the re-formation the loop runs these hooks again
        self.model.stop_training = True
        self.model.elastic_state.on_hosts_updated(time.time(), "added")

    def on_train_begin(self, logs=None):
        self.seen.append("begin")

    def on_train_end(self, logs=None):
        self.seen.append("end")

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.seen.append(epoch)

    def on_train_batch_end(self, step, logs=None):
        self.steps += 1
        if self.stop_at == (self.epoch, step):
            self._stop_here()

    def on_epoch_end(self, epoch, logs=None):
        if self.stop_at == (epoch, None):
            self._stop_here()


@pytest.mark.parametrize("elastic", [False, True])
def test_fit_with_no_epoch_still_begins_and_ends_training(elastic):
    record = Record()
    history = _model().fit(_data(), batch_size=BATCH, epochs=0, verbose=0, elastic=elastic,
                           callbacks=[record])
    assert history == {} and record.seen == ["begin", "end"]


def test_a_stop_at_an_epoch_end_survives_the_reformation_that_follows():
    record = Record(stop_at=(0, None))
    model = _model()
    history = model.fit(_data(), batch_size=BATCH, epochs=4, verbose=0, elastic=True,
                        callbacks=[record])
    # The re-formation runs the loop again (a second train begin) but no further epoch.
    assert record.seen == ["begin", 0, "begin", "end"]
    assert len(history["loss"]) == 1 and record.steps == N // BATCH
    assert model.stop_training and model.elastic_state.stop_training


def test_a_stop_mid_epoch_survives_the_reformation_and_ends_at_the_next_log_step():
    # Asked at epoch 1, step 0 (then committed, re-formed). Without elastic the stop would be
    # agreed at the next log step (log_freq=1: step 1), which ends epoch 1; here that step is
    # the first after the re-formation (the loop resumes epoch 1 at its step 1).
    record = Record(stop_at=(1, 0))
    history = _model().fit(_data(), batch_size=BATCH, epochs=4, log_freq=1, verbose=0,
                           elastic=True, callbacks=[record])
    assert record.seen == ["begin", 0, 1, "begin", 1, "end"]
    assert record.steps == N // BATCH + 1 + 1  # epoch 0; epoch 1's step 0, then its step 1
    assert len(history["loss"]) == 2
