"""accord.ray's elastic RayExecutor (min_workers/max_workers) on a Ray cluster of this machine
(``ray.cluster_utils.Cluster``: a head and a second node, 1 CPU each): the job starts on both,
goes on with one when the second node is removed, and takes a worker in again when a node is
added, with hvd.elastic.run re-forming it each time. Skipped without Ray."""
import json
import os
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'accord[ray]' "
                                        "(scripts/setup_env.sh installs it in .venv)")

from helpers.ray_processes import shutdown_reaped  # noqa: E402

from accord.errors import WorkerFailedError  # noqa: E402
from accord.ray import RayExecutor  # noqa: E402

MAX_STEPS = 2000  # bounded: the job ends at the third size change, long before


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        second = cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, logging_level="warning")
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import it
        yield cluster, second
    finally:
        shutdown_reaped(ray.shutdown, cluster.shutdown)


def train_through_changes(progress_dir):
    import torch

    import accord.torch as hvd

    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0, sizes=[])

    @hvd.elastic.run
    def train(state):
        while state.step < MAX_STEPS:
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes.append(hvd.size())
            optimizer.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            optimizer.step()
            state.step += 1
            if hvd.rank() == 0:
                path = os.path.join(progress_dir, "progress")
                with open(path + ".tmp", "w", encoding="utf-8") as fh:
                    json.dump({"sizes": state.sizes, "step": state.step}, fh)
                os.replace(path + ".tmp", path)
            if state.sizes[-3:] == [2, 1, 2]:
                break
            time.sleep(0.05)
            state.commit()
        return list(state.sizes), hvd.rank(), hvd.size()

    return train(state)


def _wait_for_sizes(progress_dir, ending, timeout=180.0):
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(progress_dir, "progress"), encoding="utf-8") as fh:
                seen = json.load(fh)["sizes"]
        except (OSError, ValueError):
            pass
        if seen and seen[-len(ending):] == ending:
            return
        time.sleep(0.2)
    raise AssertionError(f"the job never reached sizes ending {ending}; last seen {seen}")


@pytest.mark.timeout(480)
def test_the_job_shrinks_when_a_node_leaves_and_grows_when_one_joins(two_nodes, tmp_path):
    cluster, second = two_nodes
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=1, max_workers=2,
                           elastic_timeout=120)
    executor.start()
    outcome = {}

    def job():
        try:
            outcome["results"] = executor.run(train_through_changes, args=[str(tmp_path)])
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc

    runner = threading.Thread(target=job)
    runner.start()
    try:
        _wait_for_sizes(tmp_path, [2])
        cluster.remove_node(second)  # its worker dies with it: the other goes on alone
        _wait_for_sizes(tmp_path, [2, 1])
        cluster.add_node(num_cpus=1)  # Ray's main-thread-only node start: here, not in the job's thread
    finally:
        runner.join(300)
    assert not runner.is_alive()
    executor.shutdown()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["results"] == [([2, 1, 2], 0, 2), ([2, 1, 2], 1, 2)]


@pytest.mark.timeout(120)
def test_too_few_slots_for_min_workers_fails_after_elastic_timeout(two_nodes):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), min_workers=8, elastic_timeout=1)
    executor.start()
    with pytest.raises(WorkerFailedError, match=r"(?s)8 worker slots the job needs.*HINT: add nodes"):
        executor.run(os.getpid)
