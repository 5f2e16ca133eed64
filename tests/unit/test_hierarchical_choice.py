"""The automatic choice of hierarchical allreduce: settings from the variable (unset = auto),
the layout and backend rule, and the size cutoff of an automatic hierarchy."""
import pytest
import torch

from accord.comm.hierarchical import HierarchicalCommunicator, auto_hierarchy
from accord.comm.ops import ReduceOp
from accord.engine.settings import EngineSettings
from accord.errors import ConfigError


@pytest.mark.parametrize("value, forced, auto", [(None, False, True), ("0", False, False), ("1", True, False)])
def test_settings_from_the_variable(monkeypatch, value, forced, auto):
    if value is None:
        monkeypatch.delenv("HOROVOD_HIERARCHICAL_ALLREDUCE", raising=False)
        monkeypatch.delenv("ACCORD_HIERARCHICAL_ALLREDUCE", raising=False)
    else:
        monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", value)
    monkeypatch.setenv("ACCORD_HIERARCHICAL_MIN_BYTES", "4096")
    s = EngineSettings.from_config()
    assert (s.hierarchical_allreduce, s.hierarchical_auto, s.hierarchical_min_bytes) == (forced, auto, 4096)
    with pytest.raises(ConfigError, match="HINT"):
        EngineSettings(hierarchical_min_bytes=-1)


def test_auto_needs_several_hosts_with_several_ranks_on_the_default_backend(monkeypatch):
    monkeypatch.delenv("ACCORD_CPU_BACKEND", raising=False)
    monkeypatch.delenv("HOROVOD_CPU_OPERATIONS", raising=False)
    assert auto_hierarchy([[0, 1], [2, 3]], "gloo") is None
    assert "one host" in auto_hierarchy([[0, 1, 2, 3]], "gloo")
    assert "one rank" in auto_hierarchy([[0], [1]], "gloo")
    assert "not homogeneous" in auto_hierarchy([[0, 1, 2], [3]], "gloo")
    assert "explicitly" in auto_hierarchy([[0, 1], [2, 3]], "mpi")
    monkeypatch.setenv("ACCORD_CPU_BACKEND", "gloo")
    assert "explicitly" in auto_hierarchy([[0, 1], [2, 3]], "gloo")


class _Recorder:
    """A stand-in communicator that records which collectives ran (values are not the point)."""

    def __init__(self, name, size=2, rank=0):
        self.backend_name, self.size, self.rank, self.ranks, self.calls = name, size, rank, (0, 1), []

    def allreduce(self, tensor, op):
        self.calls.append(("allreduce", tensor.numel()))

    def reduce_scatter(self, tensor, op):
        self.calls.append(("reduce_scatter", tensor.numel()))
        return tensor[: (tensor.numel() + 1) // 2].clone()

    def broadcast(self, tensor, root):
        self.calls.append(("broadcast", tensor.numel()))

    def allgather(self, tensor):  # every rank sent what this one did
        self.calls.append(("allgather", tensor.numel()))
        return torch.cat([tensor] * self.size)


def test_below_min_bytes_an_automatic_hierarchy_runs_flat():
    flat, local, cross = _Recorder("gloo"), _Recorder("shm"), _Recorder("gloo")
    comm = HierarchicalCommunicator(flat, local, cross, min_bytes=1024)
    comm.allreduce(torch.zeros(255), ReduceOp.SUM)  # 1020 bytes
    assert flat.calls == [("allreduce", 255)] and not local.calls and comm.hierarchical_allreduces == 0
    comm.allreduce(torch.zeros(256), ReduceOp.SUM)  # 1024 bytes
    assert local.calls[0] == ("reduce_scatter", 256) and cross.calls == [("allreduce", 128)]
    assert comm.hierarchical_allreduces == 1 and len(flat.calls) == 1


def test_path_chooser_pairs_sizes_and_keeps_the_faster():
    from accord.comm.path_choice import FLAT, HIERARCHICAL, PathChooser

    chooser = PathChooser(pairs=2, warmup=0)
    assert chooser.next_path(1000) == HIERARCHICAL
    assert not chooser.record(1000, HIERARCHICAL, 5.0)
    assert chooser.next_path(1000) == FLAT and chooser.next_path(5000) == HIERARCHICAL  # its own class
    assert not chooser.record(1000, FLAT, 1.0)  # one pair
    assert not chooser.record(5000, HIERARCHICAL, 2.0)  # unpaired: not counted
    assert chooser.record(1000, HIERARCHICAL, 4.0) is False and chooser.record(1000, FLAT, 1.5)
    mib = 1024 * 1024
    # medians of seconds per byte, per MiB: hierarchical (5.0, 4.0) / 1000, flat (1.0, 1.5) / 1000
    assert chooser.rates() == pytest.approx([4.5 / 1000 * mib, 1.25 / 1000 * mib])
    assert chooser.decide(chooser.rates()) == FLAT and chooser.next_path(1000) == FLAT


def test_path_chooser_skips_each_paths_first_call():
    from accord.comm.path_choice import FLAT, HIERARCHICAL, PathChooser

    chooser = PathChooser(pairs=1, warmup=1)
    # the warm-up: each path once, whatever it costs (here a cold hierarchical call, 10 s)
    assert chooser.next_path(1000) == HIERARCHICAL and not chooser.record(1000, HIERARCHICAL, 10.0)
    assert chooser.next_path(1000) == FLAT and not chooser.record(1000, FLAT, 2.0)
    assert chooser.paired() == 0
    assert chooser.next_path(1000) == HIERARCHICAL and not chooser.record(1000, HIERARCHICAL, 1.0)
    assert chooser.next_path(1000) == FLAT and chooser.record(1000, FLAT, 2.0)
    assert chooser.decide(chooser.rates()) == HIERARCHICAL  # counting the warm-up would keep flat
    assert [path for path, _, _ in chooser.timings_ms()] == [HIERARCHICAL, FLAT, HIERARCHICAL, FLAT]


def test_path_chooser_compares_time_per_byte_and_resists_one_slow_call():
    from accord.comm.path_choice import FLAT, HIERARCHICAL, PathChooser

    mib = 1024 * 1024
    chooser = PathChooser(pairs=3, warmup=0)
    # sizes within one class (8-16 MiB): the hierarchy got the bigger calls and one slow call,
    # a total would keep flat (0.24 + 0.5 + 0.24 s vs 0.09 + 0.09 + 0.09 s)
    calls = [(HIERARCHICAL, 15 * mib, 0.24), (FLAT, 9 * mib, 0.09), (HIERARCHICAL, 15 * mib, 0.5),
             (FLAT, 9 * mib, 0.09), (HIERARCHICAL, 15 * mib, 0.24), (FLAT, 9 * mib, 0.09)]
    for path, nbytes, seconds in calls:
        assert chooser.next_path(nbytes) == path
        chooser.record(nbytes, path, seconds)
    assert chooser.paired() == 3
    assert chooser.rates() == pytest.approx([0.016, 0.01])  # median seconds per MiB
    assert chooser.decide(chooser.rates()) == FLAT
    chooser = PathChooser(pairs=3, warmup=0)
    for path, nbytes, seconds in [(HIERARCHICAL, 15 * mib, 0.12), (FLAT, 9 * mib, 0.09),
                                  (HIERARCHICAL, 15 * mib, 0.9), (FLAT, 9 * mib, 0.09),
                                  (HIERARCHICAL, 15 * mib, 0.12), (FLAT, 9 * mib, 0.09)]:
        chooser.record(nbytes, path, seconds)
    # 8 ms/MiB against 10: the hierarchy wins despite one 0.9 s call and smaller flat calls
    assert chooser.decide(chooser.rates()) == HIERARCHICAL


class _Clock:
    """The communicator's clock (its module's ``time``), moved only by the stand-ins' calls:
    the timings it measures are exactly their delays, whatever else runs on the machine."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _Slow(_Recorder):
    def __init__(self, name, delay, clock):
        super().__init__(name)
        self.delay, self.clock = delay, clock

    def allreduce(self, tensor, op):
        self.clock.now += self.delay if tensor.numel() > 2 else 0  # the agreement's 2 sums are quick
        super().allreduce(tensor, op)


@pytest.mark.parametrize("flat_delay, kept", [(0.03, "hierarchical"), (0.0, "flat")])
def test_measured_communicator_keeps_the_faster_path(monkeypatch, flat_delay, kept):
    import accord.comm.hierarchical as hierarchical

    clock = _Clock()
    monkeypatch.setattr(hierarchical, "time", clock)
    flat, local, cross = _Slow("gloo", flat_delay, clock), _Recorder("shm"), _Slow("gloo", 0.01, clock)
    comm = HierarchicalCommunicator(flat, local, cross, min_bytes=0, measure=True)
    for _ in range(8):  # a warm-up call of each path, then 3 pairs: hierarchical, flat, ...
        comm.allreduce(torch.zeros(1000), ReduceOp.SUM)
    assert comm.chooser.choice == kept
    assert flat.calls[-1] == ("allreduce", 2)  # the agreement on the summed timings
    before = (len(flat.calls), comm.hierarchical_allreduces)
    comm.allreduce(torch.zeros(1000), ReduceOp.SUM)
    took_hierarchy = comm.hierarchical_allreduces > before[1]
    assert took_hierarchy == (kept == "hierarchical") and (len(flat.calls) > before[0]) != took_hierarchy


def test_shard_slots_lay_shards_out_by_local_then_cross_rank():
    from accord.comm.hierarchical import shard_slots

    # hosts [0, 1] and [2, 3]; cross sets by local rank: [0, 2] and [1, 3]
    assert shard_slots([[0, 1], [2, 3]], [[0, 2], [1, 3]]) == [0, 2, 1, 3]
    assert shard_slots([[0, 2], [1, 3]], [[0, 1], [2, 3]]) == [0, 1, 2, 3]  # round-robin placement
    assert shard_slots([[0, 1], [2, 3]], [[1, 2], [0, 3]]) is None  # a place that is not its cross list


def test_reduce_scatter_goes_host_first_from_min_bytes_and_flat_without_slots():
    flat, local, cross = _Recorder("gloo", size=4), _Recorder("shm"), _Recorder("gloo")
    comm = HierarchicalCommunicator(flat, local, cross, min_bytes=1024, slots=[0, 2, 1, 3])
    comm.reduce_scatter(torch.zeros(8), ReduceOp.SUM)  # 32 bytes: flat
    assert flat.calls == [("reduce_scatter", 8)] and not local.calls and comm.hierarchical_scatters == 0
    got = comm.reduce_scatter(torch.zeros(1024), ReduceOp.SUM)  # in the host (4 padded shards), then across
    assert flat.calls[1:] == [("allgather", 1)]  # the ranks agree that each can take the hierarchy
    assert local.calls == [("reduce_scatter", 1024)] and cross.calls == [("reduce_scatter", 512)]
    assert got.shape == (256,) and comm.hierarchical_scatters == 1
    comm.reduce_scatter(torch.zeros(2048)[::2], ReduceOp.SUM)  # not contiguous: every rank goes flat
    assert flat.calls[2:] == [("allgather", 1), ("reduce_scatter", 1024)] and comm.hierarchical_scatters == 1
    unplaced = HierarchicalCommunicator(flat, local, cross, min_bytes=1024)
    unplaced.reduce_scatter(torch.zeros(1024), ReduceOp.SUM)
    assert flat.calls[-1] == ("reduce_scatter", 1024) and unplaced.hierarchical_scatters == 0
