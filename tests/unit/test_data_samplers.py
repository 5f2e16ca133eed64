"""DistributedSampler: coverage, disjointness, determinism, weights, resume, world discovery."""
from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler as TorchSampler

from accord.data.samplers import DistributedSampler, default_world

pytestmark = pytest.mark.timeout(30)


class _Data:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _shards(n, replicas, **kw):
    return [list(DistributedSampler(_Data(n), replicas, r, **kw)) for r in range(replicas)]


@pytest.mark.parametrize("n, replicas", [(12, 3), (10, 4), (7, 2), (3, 5), (1, 1), (100, 7)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_cover_and_pad(n, replicas, shuffle):
    shards = _shards(n, replicas, shuffle=shuffle, seed=3)
    per_rank = -(-n // replicas)  # ceil
    assert [len(s) for s in shards] == [per_rank] * replicas
    flat = [i for s in shards for i in s]
    assert set(flat) == set(range(n))  # every sample is read
    pad = per_rank * replicas - n
    counts = {i: flat.count(i) for i in set(flat)}
    assert sum(c - 1 for c in counts.values()) == pad  # duplicates are exactly the padding
    if pad == 0:
        assert len(flat) == len(set(flat))  # disjoint


@pytest.mark.parametrize("n, replicas", [(10, 4), (12, 3), (3, 5)])
def test_drop_last_disjoint(n, replicas):
    shards = _shards(n, replicas, drop_last=True)
    per_rank = n // replicas
    assert [len(s) for s in shards] == [per_rank] * replicas
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) and set(flat) <= set(range(n))


@pytest.mark.parametrize("n, replicas, drop_last", [(10, 4, False), (10, 4, True), (33, 3, False), (5, 8, False)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_same_shards_as_torch(n, replicas, drop_last, shuffle):
    for epoch in (0, 5):
        for rank in range(replicas):
            ours = DistributedSampler(_Data(n), replicas, rank, shuffle=shuffle, seed=11, drop_last=drop_last)
            theirs = TorchSampler(_Data(n), replicas, rank, shuffle=shuffle, seed=11, drop_last=drop_last)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


def test_deterministic_by_seed_and_epoch():
    a = DistributedSampler(_Data(50), 2, 0, seed=1)
    b = DistributedSampler(_Data(50), 2, 0, seed=1)
    assert list(a) == list(b) and list(a) == list(a)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    c = DistributedSampler(_Data(50), 2, 0, seed=2)
    assert list(c) != list(DistributedSampler(_Data(50), 2, 0, seed=1))
    assert list(DistributedSampler(_Data(6), 2, 1, shuffle=False)) == [1, 3, 5]


def test_weighted_shares():
    shards = _shards(100, 2, shuffle=False, work_load_list=[3, 1])
    assert shards == [list(range(75)), list(range(75, 100))]
    shards = _shards(10, 3, work_load_list=[1, 1, 1], seed=4)
    assert [len(s) for s in shards] == [3, 3, 4]  # MXNet's rule: round(3.33) = 3, last takes the rest
    flat = [i for s in shards for i in s]
    assert sorted(flat) == list(range(10))  # exact cover, disjoint, no padding
    # drop_last does not apply to weighted shares
    assert [len(s) for s in _shards(10, 3, work_load_list=[1, 1, 1], drop_last=True)] == [3, 3, 4]


def test_resume_mid_epoch_yields_exactly_the_rest():
    s = DistributedSampler(_Data(40), 2, 1, seed=9)
    s.set_epoch(3)
    full = list(s)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    state = s.state_dict()
    assert head == full[:7] and state["start_index"] == 7 and state["epoch"] == 3

    fresh = DistributedSampler(_Data(40), 2, 1, seed=9)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)  # the usual loop calls set_epoch(epoch) again after resuming: keeps the point
    assert len(fresh) == len(full) - 7
    assert fresh.state_dict()["start_index"] == 7
    assert list(fresh) == full[7:]
    assert list(fresh) == full  # the resume point is used once
    # equal shards advance in lock-step: rank 0 may load rank 1's state
    other = DistributedSampler(_Data(40), 2, 0, seed=9)
    other.load_state_dict(state)
    assert list(other) == _shards_epoch(40, 2, 0, 9, 3)[7:]


def _shards_epoch(n, replicas, rank, seed, epoch):
    s = DistributedSampler(_Data(n), replicas, rank, seed=seed)
    s.set_epoch(epoch)
    return list(s)


def test_resume_through_dataloader_and_after_epoch_end():
    s = DistributedSampler(_Data(30), 3, 0, seed=2)
    loader = DataLoader(_Data(30), batch_size=4, sampler=s)
    full = [int(i) for batch in loader for i in batch]
    it = iter(loader)
    next(it), next(it)
    state = s.state_dict()
    assert state["start_index"] == 8
    t = DistributedSampler(_Data(30), 3, 0, seed=2)
    t.load_state_dict(state)
    rest = [int(i) for batch in DataLoader(_Data(30), batch_size=4, sampler=t) for i in batch]
    assert rest == full[8:]

    # a state saved after a finished epoch resumes to nothing, until the next epoch starts
    assert len(list(s)) == 10
    done = s.state_dict()
    assert done["start_index"] == 10
    u = DistributedSampler(_Data(30), 3, 0, seed=2)
    u.load_state_dict(done)
    assert len(u) == 0 and list(u) == []
    u.load_state_dict(done)
    u.set_epoch(1)
    assert len(list(u)) == 10


def test_load_state_mismatch_and_bad_values():
    s = DistributedSampler(_Data(20), 2, 0, seed=1)
    state = s.state_dict()
    with pytest.raises(ValueError, match="(?s)num_replicas: saved 2 vs now 4.*HINT:"):
        DistributedSampler(_Data(20), 4, 0, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset_len"):
        DistributedSampler(_Data(21), 2, 0, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="start_index=99"):
        s.load_state_dict({**state, "start_index": 99})
    w0 = DistributedSampler(_Data(20), 2, 0, work_load_list=[1, 3])
    w1 = DistributedSampler(_Data(20), 2, 1, work_load_list=[1, 3])
    with pytest.raises(ValueError, match="rank"):
        w1.load_state_dict(w0.state_dict())


def test_argument_errors():
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\]"):
        DistributedSampler(_Data(4), 2, 2)
    with pytest.raises(ValueError, match="num_replicas"):
        DistributedSampler(_Data(4), 0, 0)
    with pytest.raises(ValueError, match="3 weights .* 2 replicas"):
        DistributedSampler(_Data(4), 2, 0, work_load_list=[1, 1, 1])
    with pytest.raises(ValueError, match="(?s)cannot shard a dataset of 2 samples over 3 ranks.*HINT:"):
        DistributedSampler(_Data(2), 3, 0, work_load_list=[1, 1, 1])
    with pytest.raises(ValueError, match="epoch"):
        DistributedSampler(_Data(4), 1, 0).set_epoch(-1)


def test_world_discovery():
    s = DistributedSampler(_Data(9), world=lambda: (3, 2), shuffle=False)
    assert (s.num_replicas, s.rank) == (3, 2) and list(s) == [2, 5, 8]
    s = DistributedSampler(_Data(9), rank=0, world=lambda: (3, 2), shuffle=False)
    assert (s.num_replicas, s.rank) == (3, 0)
    assert default_world() == (1, 0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert default_world() == (1, 0)
        assert DistributedSampler(_Data(5)).num_replicas == 1
    finally:
        dist.destroy_process_group()
