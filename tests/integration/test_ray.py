"""accord.ray on a local Ray cluster (``ray.init(num_cpus=2)``, once for the module): RayExecutor's
results in rank order, the same training as accordrun's, a worker that raises and an actor that
dies, and Ray Train's TorchTrainer running DDP on the accord backend. Skipped without Ray."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'accord[ray]' "
                                        "(scripts/setup_env.sh installs it in .venv)")

from helpers.ray_processes import shutdown_reaped  # noqa: E402

from accord.errors import ConfigError, WorkerFailedError  # noqa: E402
from accord.ray import RayExecutor  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "ray_parity_train.py"


def _load_parity():
    spec = importlib.util.spec_from_file_location("ray_parity_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Ray's cloudpickle sends only imported modules by value
    spec.loader.exec_module(module)
    return module


parity = _load_parity()


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    # the actors cannot import this test module or the script: their functions go by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(parity)
    try:
        yield
    finally:
        shutdown_reaped(ray.shutdown)


@pytest.fixture
def executor(local_ray):
    made = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2, cpus_per_worker=1)
    made.start()
    try:
        yield made
    finally:
        made.shutdown()


def coordinates(scale):
    import torch

    import accord.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1) * scale]), op=hvd.Sum)
    return hvd.rank(), hvd.size(), hvd.local_rank(), total.item(), os.environ["RANK"]


class Counter:
    """An executable_cls: one per worker, built by start()."""

    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += int(os.environ["ACCORD_RANK"]) + 1
        return self.value


@pytest.mark.timeout(240)
def test_run_returns_every_ranks_result_in_rank_order(executor):
    # ranks 0 and 1 add 1*scale and 2*scale: 3*scale, computed here from the same definition
    assert executor.run(coordinates, args=[2.0]) == [(0, 2, 0, 6.0, "0"), (1, 2, 1, 6.0, "1")]
    assert executor.run(coordinates, kwargs={"scale": 0.5}) == [(0, 2, 0, 1.5, "0"), (1, 2, 1, 1.5, "1")]
    refs = executor.run_remote(coordinates, args=[1.0])
    assert [r[0] for r in ray.get(refs, timeout=120)] == [0, 1]


@pytest.mark.timeout(240)
def test_execute_and_execute_single_call_the_executable(local_ray):
    made = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    made.start(executable_cls=Counter, executable_args=[10])
    try:
        assert made.execute(lambda counter: counter.bump()) == [11, 12]
        assert made.execute_single(lambda counter: counter.bump()) == 12  # rank 0 only
        assert made.execute(lambda counter: counter.value) == [12, 12]
    finally:
        made.shutdown()


@pytest.mark.timeout(300)
def test_training_equals_accordruns_with_the_same_script_and_seeds(executor, tmp_path):
    out = tmp_path / "accordrun"
    subprocess.run([sys.executable, "-m", "accord.run", "-np", "2", sys.executable, str(SCRIPT), str(out)],
                   check=True, timeout=180)
    launched = [json.loads((tmp_path / f"accordrun.{r}").read_text()) for r in range(2)]
    on_ray = executor.run(parity.train)
    assert [r["rank"] for r in on_ray] == [0, 1] and {r["size"] for r in on_ray} == {2}
    assert on_ray == launched  # the same engine, data and seeds: the same numbers
    expected = parity.reference()  # one process, the whole data set
    for result in on_ray:
        for got, want in zip(result["params"], expected):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def raise_on_rank_one():
    import torch

    import accord.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one says no")
    hvd.allreduce(torch.ones(1), name="never.complete")  # rank 0 waits here until it is stopped
    return "unreachable"


@pytest.mark.timeout(240)
def test_a_worker_that_raises_fails_run_with_its_traceback(executor):
    pids = executor.run(os.getpid)
    with pytest.raises(WorkerFailedError) as info:
        executor.run(raise_on_rank_one)
    text = str(info.value)
    assert "rank 1 of 2" in text and "ValueError: rank one says no" in text
    assert "Traceback from rank 1:" in text and "in raise_on_rank_one" in text
    assert "\nHINT: " in text and info.value.rank == 1
    assert isinstance(info.value.__cause__, ValueError)
    _all_gone(pids)  # rank 0, stuck in its allreduce, was stopped too
    with pytest.raises(ConfigError, match="call start"):
        executor.run(os.getpid)
    executor.start()  # a new job on fresh workers
    assert [r[0] for r in executor.run(coordinates, args=[1.0])] == [0, 1]


def kill_rank_one_mid_training():
    import torch

    import accord.torch as hvd

    hvd.init()
    for step in range(600):  # bounded: rank 0 is stopped long before
        hvd.allreduce(torch.ones(1), name="step")
        if hvd.rank() == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
    return "finished"


@pytest.mark.timeout(240)
def test_a_killed_actor_stops_the_job_with_a_clear_error_and_leaves_no_process(executor):
    pids = executor.run(os.getpid)
    with pytest.raises(WorkerFailedError) as info:
        executor.run(kill_rank_one_mid_training)
    text = str(info.value)
    assert "rank 1 of 2" in text and f"pid {pids[1]}" in text and "died before its function returned" in text
    assert "\nHINT: " in text and info.value.rank == 1
    _all_gone(pids)


def _all_gone(pids, timeout=60.0):
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.2)
    assert not alive, f"worker processes still running: {alive}"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.mark.timeout(120)
def test_refuses_what_it_cannot_do(local_ray):
    settings = RayExecutor.create_settings(timeout_s=30)
    with pytest.raises(ConfigError, match="callbacks are not supported"):
        RayExecutor(settings, num_workers=2).run(os.getpid, callbacks=[print])
    with pytest.raises(ConfigError, match="call start"):
        RayExecutor(settings, num_workers=2).run(os.getpid)
    tiny = RayExecutor(RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=0.5), num_workers=3)
    with pytest.raises(Exception, match="could not reserve 3 x"):  # 3 CPUs asked of 2
        tiny.start()


def ddp_on_accord(config):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    model = parity.fresh_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x, y = parity.data()
    half = parity.SAMPLES // dist.get_world_size()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=parity.LR)
    params = parity._steps(ddp, optimizer, x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half])
    with open(os.path.join(config["out"], f"rank.{rank}"), "w", encoding="utf-8") as fh:
        json.dump({"backend": dist.get_backend(), "size": dist.get_world_size(), "sum": total.item(),
                   "params": params}, fh)


@pytest.mark.timeout(420)
def test_ray_train_torch_trainer_runs_ddp_on_the_accord_backend(local_ray, tmp_path, monkeypatch):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # Ray Train's controller takes these from this process's environment: its preemption
    # watcher (an actor process of its own, watching for spot-instance preemption) has nothing
    # to do with the backend, and polling the workers every 0.5 s (Ray's default: 2 s) sees the
    # end of the run sooner
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    out = tmp_path / "ranks"
    out.mkdir()
    trainer = TorchTrainer(ddp_on_accord, train_loop_config={"out": str(out)},
                           scaling_config=ScalingConfig(num_workers=2),
                           torch_config=TorchConfig(backend="accord"),
                           run_config=RunConfig(storage_path=str(tmp_path / "results"), name="accord"))
    result = trainer.fit()
    assert result.error is None
    reports = [json.loads((out / f"rank.{r}").read_text()) for r in range(2)]
    assert [r["backend"] for r in reports] == ["accord", "accord"]
    assert [r["sum"] for r in reports] == [3.0, 3.0] and {r["size"] for r in reports} == {2}
    expected = parity.reference()  # DDP averages the halves' gradients: the whole batch's
    for report in reports:
        for got, want in zip(report["params"], expected):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
