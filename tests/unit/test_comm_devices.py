"""The GPU backend chosen at init: NCCL, or host staging when NCCL cannot carry the job.

Pure decisions over a job-wide table of what each rank sees, plus init() in one process on a
torch that (by monkeypatching) sees a GPU but has no NCCL: CPU work must keep working.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from accord import config
from accord.comm import backend_name_for, devices, get_backend, known_backends
from accord.comm.devices import GpuView, choose_gpu_backend, device_backends, nccl_problem
from accord.comm.host_staged import HostStagedBackend
from accord.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

ONE_GPU = GpuView(True, ("GPU-aaaa",))
TWO_GPUS = GpuView(True, ("GPU-aaaa", "GPU-bbbb"))


def test_view_round_trips_through_its_store_text():
    for view in (ONE_GPU, TWO_GPUS, GpuView(False, ()), GpuView(True, ("cuda:0",))):
        assert GpuView.decode(view.encode()) == view


def test_ranks_sharing_one_gpu_use_host_staging():
    hosts, views = ["a", "a"], [ONE_GPU, ONE_GPU]
    problem = nccl_problem(hosts, views)
    assert problem == ("2 ranks on host 'a' (ranks [0, 1]) share 1 GPU(s) (GPU-aaaa), and NCCL "
                       "needs a GPU of its own per rank")
    assert choose_gpu_backend("auto", hosts, views) == "host"
    assert choose_gpu_backend(" AUTO ", hosts, views) == "host"


def test_one_gpu_per_rank_uses_nccl():
    # every rank sees both GPUs; or each sees only its own (CUDA_VISIBLE_DEVICES per rank)
    assert choose_gpu_backend("auto", ["a", "a"], [TWO_GPUS, TWO_GPUS]) == "nccl"
    own = [GpuView(True, ("GPU-aaaa",)), GpuView(True, ("GPU-bbbb",))]
    assert choose_gpu_backend("auto", ["a", "a"], own) == "nccl"
    # one rank per host, both hosts' GPU called cuda:0: different hosts, no sharing
    cuda0 = GpuView(True, ("cuda:0",))
    assert choose_gpu_backend("nccl", ["a", "b"], [cuda0, cuda0]) == "nccl"


def test_more_ranks_than_gpus_on_one_host_only():
    hosts = ["a", "a", "b", "b", "b"]
    views = [TWO_GPUS] * 5
    assert "3 ranks on host 'b' (ranks [2, 3, 4]) share 2 GPU(s)" in nccl_problem(hosts, views)


def test_torch_without_nccl_uses_host_staging():
    views = [ONE_GPU, GpuView(False, ("GPU-bbbb",))]
    assert nccl_problem(["a", "b"], views) == "torch on rank(s) [1] was built without NCCL"
    assert choose_gpu_backend("auto", ["a", "b"], views) == "host"


def test_explicit_nccl_on_a_shared_gpu_is_a_clear_error():
    with pytest.raises(ConfigError) as err:
        choose_gpu_backend("nccl", ["node7", "node7"], [ONE_GPU, ONE_GPU])
    text = str(err.value)
    assert "ACCORD_GPU_BACKEND=nccl" in text and "host 'node7'" in text and "GPU-aaaa" in text
    assert "HINT:" in text and "ACCORD_GPU_BACKEND=auto" in text


def test_other_names_are_taken_as_given():
    shared = [ONE_GPU, ONE_GPU]
    assert choose_gpu_backend("host", ["a", "a"], shared) == "host"
    assert choose_gpu_backend("my-vendor", ["a", "a"], shared) == "my-vendor"


def test_host_backend_is_registered_and_static_default_is_nccl(monkeypatch):
    monkeypatch.delenv("ACCORD_GPU_BACKEND", raising=False)
    assert config.get("ACCORD_GPU_BACKEND") == "auto"
    assert backend_name_for("cuda") == "nccl"
    assert "host" in known_backends()
    host = get_backend("host")
    assert isinstance(host, HostStagedBackend) and host.device_types == frozenset({"cuda"})
    assert host.inner.name == "gloo"


def test_device_backends_without_cuda_is_cpu_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    store = dist.HashStore()
    backends = device_backends(store, 0, ["a", "a"], single_host=True)
    assert list(backends) == ["cpu"] and backends["cpu"].name == "shm"
    assert store.num_keys() == 0  # no exchange at all without CUDA


def test_device_backends_exchanges_views_and_agrees(monkeypatch):
    """Two ranks on one host, one GPU: both publish, both choose host staging."""
    import threading

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "local_view", lambda: ONE_GPU)
    monkeypatch.delenv("ACCORD_GPU_BACKEND", raising=False)
    store = dist.HashStore()
    got: dict[int, dict] = {}

    def rank(r: int) -> None:
        got[r] = device_backends(store, r, ["a", "a"], single_host=True)

    workers = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(10)
    for r in (0, 1):
        cuda = got[r]["cuda"]
        assert isinstance(cuda, HostStagedBackend) and cuda.inner.name == "shm", got
        assert got[r]["cpu"].name == "shm"


def test_device_backends_nccl_when_each_rank_has_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "local_view", lambda: TWO_GPUS)
    monkeypatch.delenv("ACCORD_GPU_BACKEND", raising=False)
    store = dist.HashStore()
    store.set("accord/gpus/1", TWO_GPUS.encode())  # the peer already reported
    backends = device_backends(store, 0, ["a", "a"], single_host=True)
    assert backends["cuda"].name == "nccl"


def test_device_backends_names_a_peer_that_never_reports(monkeypatch):
    from accord.errors import RendezvousError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "local_view", lambda: ONE_GPU)
    monkeypatch.setenv("ACCORD_START_TIMEOUT", "0.5")
    with pytest.raises(RendezvousError, match=r"rank\(s\) \[1\] did not report their GPUs"):
        device_backends(dist.HashStore(), 0, ["a", "b"], single_host=False)


@pytest.fixture
def no_launcher(monkeypatch):
    """One process, no launcher variables (accord makes its own in-memory store)."""
    for key in config.snapshot():
        if key.startswith(("ACCORD_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_")) \
                or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_cuda_host_without_nccl_still_initializes_for_cpu_work(no_launcher):
    """The case noted in review: torch sees a GPU but has no NCCL. init() must not fail; CPU
    collectives run; CUDA tensors would go through host memory."""
    import accord.torch as hvd
    from accord.engine import session

    no_launcher.setattr(torch.cuda, "is_available", lambda: True)
    no_launcher.setattr(torch.cuda, "device_count", lambda: 1)
    no_launcher.setattr(dist, "is_nccl_available", lambda: False)
    no_launcher.setattr(devices, "_device_id", lambda index: f"GPU-fake{index}")
    hvd.init()
    try:
        assert not dist.is_initialized()  # the engine's groups are private: none asks for NCCL
        assert session.backend_name("cuda") == "host"
        assert session.backend_name("cpu") == "gloo"
        t = torch.arange(6, dtype=torch.float32)
        assert torch.equal(hvd.allreduce(t, op=hvd.Sum, name="cpu.work"), t)
        assert torch.equal(hvd.broadcast(t * 2, root_rank=0, name="cpu.bcast"), t * 2)
    finally:
        hvd.shutdown()
