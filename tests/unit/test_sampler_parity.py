"""Samplers against the libraries users come from, element for element.

- ``accord.data.DistributedSampler`` without weights against ``torch.utils.data.DistributedSampler``
  (indices, padding by wrap-around, drop_last, ``len``) over a grid of sizes, ranks and options.
- ``work_load_list`` against MXNet's ``executor_manager._split_input_slice`` (restated below from
  its definition): the same shares, and every sample read exactly once per epoch over the ranks.
- ``hvd.elastic.ElasticSampler`` against Horovod 0.28.1's (restated below): the split after
  ``record_batch`` calls and a re-formation with another world size, from our state or Horovod's.
"""
from __future__ import annotations

import io
import itertools
import math
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler as TorchSampler

import accord.torch as hvd
from accord.data.samplers import DistributedSampler
from accord.data.split import slice_bounds
from accord.torch import gateway
from tests.helpers.mxnet_split import mxnet_slice_bounds

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("shuffle, drop_last", list(itertools.product([False, True], repeat=2)))
def test_same_indices_and_len_as_torch(shuffle, drop_last):
    for n, replicas, seed, epoch in itertools.product([0, 1, 2, 5, 7, 13, 16, 31], [1, 2, 3, 5, 8],
                                                      [0, 7], [0, 3]):
        for rank in range(replicas):
            ours = DistributedSampler(range(n), replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
            theirs = TorchSampler(range(n), replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            where = (n, replicas, rank, seed, epoch)
            assert list(ours) == list(theirs), where
            assert len(ours) == len(theirs), where


def test_weighted_shares_are_mxnets_and_cover_each_sample_once():
    rng = random.Random(0)
    lists = [[1], [1, 1], [1, 3], [3, 1], [1, 1, 1], [0.5, 0.25, 0.25], [1, 2, 3, 4], [1e-3, 1]]
    lists += [[rng.choice([0.3, 1, 2, 7]) for _ in range(rng.randint(1, 5))] for _ in range(30)]
    for weights, n in itertools.product(lists, range(40)):
        want = mxnet_slice_bounds(n, weights)
        if any(b >= e for b, e in want):  # an empty share: MXNet refuses it too
            with pytest.raises(ValueError, match="HINT:"):
                slice_bounds(n, weights)
            continue
        assert slice_bounds(n, weights) == want, (n, weights)
        shards = []
        for rank in range(len(weights)):
            sampler = DistributedSampler(range(n), len(weights), rank, seed=2, work_load_list=weights)
            sampler.set_epoch(1)
            shards.append(list(sampler))
            assert len(sampler) == len(shards[-1])
        assert [len(s) for s in shards] == [e - b for b, e in want]
        assert sorted(i for s in shards for i in s) == list(range(n)), (n, weights)


def test_numpy_weights_work_like_python_numbers():
    # np.array([1, 3]) holds np.int64, which is no Python int: it must not be refused as "bad".
    for weights in (np.array([1, 3]), [np.int64(1), np.int64(3)], np.array([1.0, 3.0], dtype=np.float32)):
        assert slice_bounds(10, weights) == slice_bounds(10, [1, 3])
        sampler = DistributedSampler(range(10), 2, 1, work_load_list=weights)
        assert list(sampler) == list(DistributedSampler(range(10), 2, 1, work_load_list=[1, 3]))
        buffer = io.BytesIO()
        torch.save(sampler.state_dict(), buffer)  # a checkpoint must load with weights_only=True
        buffer.seek(0)
        sampler.load_state_dict(torch.load(buffer, weights_only=True))


@pytest.mark.parametrize("weights, replicas, match", [
    ([1, 2, 3], 2, "3 weights"), ([1, -1], 2, "bad: \\[-1\\]"), ([0, 0], 2, "bad: \\[0, 0\\]"),
    ([float("nan"), 1], 2, "bad: \\[nan\\]"), ([True, 1], 2, "bad: \\[True\\]"), ([1, 50], 2, "empty")])
def test_bad_work_load_lists_say_what_and_hint(weights, replicas, match):
    for rank in range(replicas):  # every rank refuses the same way (nothing waits on a peer)
        with pytest.raises(ValueError, match=match) as info:
            DistributedSampler(range(10), replicas, rank, work_load_list=weights)
        assert "\nHINT: " in str(info.value)


class _Horovod:
    """Horovod 0.28.1's ElasticSampler, restated from its definition: ``record_batch`` adds
    ``batch_size * size`` to ``processed_num``; the rest of the epoch is its shuffled order after
    the first ``processed_num`` samples, padded once from its start, every ``size``-th."""

    def __init__(self, n, seed, size, rank, state):
        order = list(range(n))
        random.Random(seed + state["epoch"]).shuffle(order)
        self.size, self.rank, self.processed_num = size, rank, state["processed_num"]
        self.rest = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.rest) / size)

    def indices(self):
        total = self.num_samples * self.size
        padded = self.rest + self.rest[:total - len(self.rest)]
        return padded[self.rank:total:self.size] if len(padded) == total else None  # None: assert


def _world(monkeypatch, size, rank):
    monkeypatch.setattr(gateway, "is_initialized", lambda: True)
    monkeypatch.setattr(gateway, "size", lambda: size)
    monkeypatch.setattr(gateway, "rank", lambda: rank)


def test_elastic_sampler_resplits_like_horovod_after_a_reformation(monkeypatch):
    checked = 0
    for n, size, batch, steps, new_size in itertools.product([0, 5, 11, 23, 40], [1, 2, 3], [1, 2, 5],
                                                               [0, 1, 3], [1, 2, 4]):
        _world(monkeypatch, size, 0)
        sampler = hvd.elastic.ElasticSampler(range(n), seed=4)
        sampler.set_epoch(2)
        list(sampler)
        for step in range(steps):
            sampler.record_batch(step, batch)
        ours = sampler.state_dict()
        theirs = {"epoch": 2, "processed_num": steps * batch * size}
        for rank in range(new_size):
            _world(monkeypatch, new_size, rank)
            want = _Horovod(n, 4, new_size, rank, theirs)
            for state in (ours, theirs):  # our state, and a state Horovod saved
                again = hvd.elastic.ElasticSampler(range(n), seed=4)
                again.load_state_dict(state)
                if want.indices() is not None:  # Horovod's assert fails where we pad by cycling
                    assert list(again) == want.indices(), (n, size, batch, steps, new_size, rank)
                    assert len(again) == want.num_samples
                    checked += 1
    assert checked > 1000


def test_elastic_padding_cycles_where_horovod_asserts(monkeypatch):
    # 1 sample left for 3 ranks: Horovod pads once (2 indices, assert fails); we repeat it.
    for rank in range(3):
        _world(monkeypatch, 3, rank)
        sampler = hvd.elastic.ElasticSampler(range(4), shuffle=False)
        sampler.load_state_dict({"epoch": 0, "processed_num": 3})
        assert list(sampler) == [3] and len(sampler) == 1
