"""hvd.elastic pieces that need no ranks: ElasticSampler bookkeeping, state commit/restore."""
import random

import pytest
import torch

import accord.torch as hvd
from accord.torch import gateway

pytestmark = pytest.mark.timeout(30)


def test_sampler_single_process_records_and_resumes():
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    assert list(sampler) == list(range(10)) and len(sampler) == 10
    sampler.record_batch(0, 3)
    sampler.record_indices([9])
    assert sampler.state_dict() == {"epoch": 0, "processed_indices": {0, 1, 2, 9}, "processed_num": 4}
    sampler.reset()
    assert list(sampler) == [3, 4, 5, 6, 7, 8] and len(sampler) == 6
    saved = sampler.state_dict()
    sampler.set_epoch(1)
    assert len(sampler) == 10 and sampler.processed_indices == set()
    sampler.load_state_dict(saved)
    assert sampler.epoch == 0 and list(sampler) == [3, 4, 5, 6, 7, 8]


def test_sampler_shuffle_depends_on_seed_and_epoch_only():
    a = hvd.elastic.ElasticSampler(list(range(20)), seed=3)
    b = hvd.elastic.ElasticSampler(list(range(20)), seed=3)
    assert list(a) == list(b) and sorted(a) == list(range(20))
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(20))


def test_sampler_splits_remaining_samples_over_ranks(monkeypatch):
    monkeypatch.setattr(gateway, "is_initialized", lambda: True)
    monkeypatch.setattr(gateway, "size", lambda: 3)
    shares = []
    for r in range(3):
        monkeypatch.setattr(gateway, "rank", lambda r=r: r)
        sampler = hvd.elastic.ElasticSampler(list(range(11)), shuffle=False)
        sampler.record_indices([0, 1, 2, 3])  # 7 left -> 3 each, 2 padded
        sampler.reset()
        shares.append(list(sampler))
        assert len(sampler) == 3
    assert sorted(set(i for s in shares for i in s)) == [4, 5, 6, 7, 8, 9, 10]
    assert sum(len(s) for s in shares) == 9


def _horovod_share(n, seed, epoch, processed_num, size, rank):
    """Horovod 0.24+'s split, computed here from its definition: the epoch's shuffled order less
    its first processed_num samples, padded from its start to a multiple of size, every size-th."""
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    rest = order[processed_num:]
    per_rank = -(-len(rest) // size)
    padded = (rest * size)[:per_rank * size] if rest else []
    return padded[rank::size]


def test_sampler_counts_and_splits_as_horovods(monkeypatch):
    monkeypatch.setattr(gateway, "is_initialized", lambda: True)
    monkeypatch.setattr(gateway, "size", lambda: 3)
    for rank in range(3):
        monkeypatch.setattr(gateway, "rank", lambda r=rank: r)
        sampler = hvd.elastic.ElasticSampler(list(range(23)), shuffle=True, seed=4)
        sampler.set_epoch(2)
        assert list(sampler) == _horovod_share(23, 4, 2, 0, 3, rank)
        sampler.record_batch(0, 2)  # 2 samples of each of the 3 ranks
        sampler.record_batch(7, 2)  # the index is not used: the job's next batch
        assert sampler.processed_num == 12
        saved = sampler.state_dict()
        sampler.record_batch(2, 2)
        assert sampler.processed_num == 18
        sampler.load_state_dict(saved)  # restore: the next record counts from there
        assert sampler.processed_num == 12 and list(sampler) == _horovod_share(23, 4, 2, 12, 3, rank)
        sampler.record_batch(0, 2)
        assert sampler.processed_num == 18 and len(sampler) == 4  # the split changes at a reset
        # a state saved by Horovod's sampler holds only the count
        sampler.load_state_dict({"epoch": 5, "processed_num": 9})
        assert (sampler.epoch, sampler.processed_num) == (5, 9)
        assert list(sampler) == _horovod_share(23, 4, 5, 9, 3, rank)


def test_object_state_commit_restore_and_reset_callbacks():
    calls = []
    state = hvd.elastic.ObjectState(lambda obj: obj, lambda: 0, epoch=1, seen=[1])
    state.register_reset_callbacks([lambda: calls.append("cb")])
    state.epoch, state.seen = 2, [1, 2]
    state.commit()
    state.epoch = 3
    state.seen.append(3)
    state.restore()
    assert (state.epoch, state.seen) == (2, [1, 2])
    state.on_reset()
    assert calls == ["cb"]
    state.on_hosts_updated(1.0)
    with pytest.raises(hvd.elastic.HostsUpdatedInterrupt):
        state.commit()


def test_torch_state_saves_model_and_optimizer(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # first optimizer sets it
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    assert state.model is model and state.optimizer is opt and state.epoch == 0
    before = model.weight.detach().clone()
    state.commit()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    state.epoch = 5
    assert not torch.equal(model.weight, before)
    state.restore()
    assert torch.equal(model.weight, before) and state.epoch == 0
    assert model.weight.grad is None  # the aborted step's gradients are dropped
    assert opt.state_dict()["state"] == {}


def test_sampler_records_the_whole_jobs_batch(monkeypatch):
    """record_batch marks every rank's share of the batch, so a rank that dies after a commit
    takes no processed samples with it."""
    monkeypatch.setattr(gateway, "is_initialized", lambda: True)
    monkeypatch.setattr(gateway, "size", lambda: 3)
    monkeypatch.setattr(gateway, "rank", lambda: 1)
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)  # 4 each, 2 padded
    mine = list(sampler)
    assert mine == [1, 4, 7, 0]
    sampler.record_batch(0, 2)  # rank 0: [0, 3], rank 1: [1, 4], rank 2: [2, 5]
    assert sampler.processed_indices == {0, 1, 2, 3, 4, 5}
    sampler.record_batch(1, 2)  # rank 0: [6, 9], rank 1: [7, 0], rank 2: [8, 1] (padding)
    assert sampler.processed_indices == set(range(10))


def test_host_updates_interrupt_at_the_next_commit_skip_sync_only_for_removals():
    state = hvd.elastic.ObjectState(lambda obj: obj, lambda: 0, epoch=1)
    state.on_hosts_updated(1.0, "removed")
    with pytest.raises(hvd.elastic.HostsUpdatedInterrupt) as info:
        state.commit()
    assert info.value.skip_sync
    state.commit()  # handled: no second interrupt
    state.on_hosts_updated(2.0, "removed")
    state.on_hosts_updated(3.0, "added")
    with pytest.raises(hvd.elastic.HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert not info.value.skip_sync


def test_every_reformation_bootstraps_a_new_generation_whatever_the_sizes():
    from accord.runtime.rendezvous import next_bootstrap_count

    count, last, used = 0, -1, []
    for size in [2, 4, 2, 3, 2, 5, 1, 3, 3, 6, 4]:  # grow, shrink, grow onto a third host, ...
        count = next_bootstrap_count(count, size, last)
        generations = {(count + i) // size for i in range(size)}  # (counter after add - 1) // size
        count += size
        assert len(generations) == 1, (size, generations)
        last = generations.pop()
        used.append(last)
    assert used == sorted(set(used)), used  # strictly increasing: no generation twice
    # after 2, 4, 2 ranks, 3 ranks must not meet an old generation's keys
    assert next_bootstrap_count(10, 3, 4) == 15 and next_bootstrap_count(10, 3, 4) // 3 == 5


class _Progress:
    """A user's object held by the state (and by the rest of the script)."""

    def __init__(self):
        self.seen = 0


def test_object_state_keeps_objects_by_reference_and_snapshots_plain_data():
    import pickle

    progress, history = _Progress(), [1]
    state = hvd.elastic.ObjectState(lambda obj: obj, lambda: 0, progress=progress, history=history)
    assert state.progress is progress and state.history is history  # as Horovod: the script's objects
    state.commit()
    progress.seen = 5
    state.history.append(2)
    state.restore()
    assert state.progress is progress and progress.seen == 5  # an object: by reference (Horovod)
    assert state.history == [1]  # plain data: the commit's snapshot
    # sync on rank 0 keeps its objects; elsewhere the attributes become rank 0's copies
    state.sync()
    assert state.progress is progress
    copies = hvd.elastic.ObjectState(lambda obj: pickle.loads(pickle.dumps(obj)), lambda: 1, progress=progress)
    copies.sync()
    assert copies.progress is not progress and copies.progress.seen == 5


def test_torch_state_keeps_a_learning_rate_scheduler_and_restores_its_state(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, epoch=0)
    assert state.scheduler is sched
    state.commit()
    opt.step()  # no gradients: changes nothing, but keeps the scheduler's order check quiet
    state.scheduler.step()  # reaches the real optimizer
    assert opt.param_groups[0]["lr"] == 0.5 and sched.last_epoch == 1
    state.restore()
    assert state.scheduler is sched and sched.last_epoch == 0 and sched.get_last_lr() == [1.0]
    assert opt.param_groups[0]["lr"] == 1.0  # the optimizer's own state, restored beside it
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.5  # still drives the optimizer after the restore
