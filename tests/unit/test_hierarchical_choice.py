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

    chooser = PathChooser(pairs=2)
    assert chooser.next_path(1000) == HIERARCHICAL
    assert not chooser.record(1000, HIERARCHICAL, 5.0)
    assert chooser.next_path(1000) == FLAT and chooser.next_path(5000) == HIERARCHICAL  # its own class
    assert not chooser.record(1000, FLAT, 1.0)  # one pair
    assert not chooser.record(5000, HIERARCHICAL, 2.0)  # unpaired: not counted
    assert chooser.record(1000, HIERARCHICAL, 4.0) is False and chooser.record(1000, FLAT, 1.5)
    assert chooser.totals() == [9.0, 2.5]
    assert chooser.decide([9.0, 2.5]) == FLAT and chooser.next_path(1000) == FLAT


class _Slow(_Recorder):
    def __init__(self, name, delay):
        super().__init__(name)
        self.delay = delay

    def allreduce(self, tensor, op):
        import time

        time.sleep(self.delay if tensor.numel() > 2 else 0)  # the agreement's 2 sums are quick
        super().allreduce(tensor, op)


@pytest.mark.parametrize("flat_delay, kept", [(0.03, "hierarchical"), (0.0, "flat")])
def test_measured_communicator_keeps_the_faster_path(flat_delay, kept):
    flat, local, cross = _Slow("gloo", flat_delay), _Recorder("shm"), _Slow("gloo", 0.01)
    comm = HierarchicalCommunicator(flat, local, cross, min_bytes=0, measure=True)
    for _ in range(6):  # 3 pairs: hierarchical, flat, hierarchical, flat, ...
        comm.allreduce(torch.zeros(1000), ReduceOp.SUM)
    assert comm.chooser.choice == kept
    assert flat.calls[-1] == ("allreduce", 2)  # the agreement on the summed timings
    before = (len(flat.calls), comm.hierarchical_allreduces)
    comm.allreduce(torch.zeros(1000), ReduceOp.SUM)
    took_hierarchy = comm.hierarchical_allreduces > before[1]
    assert took_hierarchy == (kept == "hierarchical") and (len(flat.calls) > before[0]) != took_hierarchy
