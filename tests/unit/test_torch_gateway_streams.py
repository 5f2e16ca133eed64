"""CUDA results handed to a caller on a side stream are recorded on that stream (so torch's
caching allocator cannot give their memory to the engine while the caller's kernels read it).
CUDA is imitated: the real call runs on a GPU in tests/gpu."""
from unittest import mock

import torch

from accord.torch import gateway


def _cuda_tensor():
    t = mock.MagicMock(spec=torch.Tensor)
    t.is_cuda, t.device = True, torch.device("cuda", 0)
    return t


def test_results_are_recorded_on_a_side_stream(monkeypatch):
    side, default = object(), object()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: default)
    one, two, splits = _cuda_tensor(), _cuda_tensor(), torch.tensor([1, 2])
    gateway.used_on_callers_stream([one, two])
    gateway.used_on_callers_stream((one, splits))  # alltoall's (tensor, received splits)
    assert one.record_stream.call_args_list == [mock.call(side), mock.call(side)]
    two.record_stream.assert_called_once_with(side)


def test_nothing_is_recorded_on_the_default_stream_or_for_cpu_tensors(monkeypatch):
    default = object()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: default)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: default)
    t = _cuda_tensor()
    gateway.used_on_callers_stream(t)
    gateway.used_on_callers_stream([torch.zeros(2), None, 3])
    t.record_stream.assert_not_called()
