"""accord's strategies through the ``lightning`` package (``import lightning as L``), whose classes
are not pytorch_lightning's: ``L.Trainer(strategy="horovod")`` and ``L.Fabric(strategy="accord")``
under ``accordrun -np 2`` (scripts/lightning_unified.py)."""
import pytest
import torch
from helpers import framework_jobs as jobs

jobs.require("lightning", "pip install lightning")

common = jobs.common()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TOL = 1e-10


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lightning-unified")
    jobs.succeeded(jobs.accordrun("lightning_unified.py", str(folder), timeout=240))
    return str(folder)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def test_lightning_trainer(out):
    results = common.read(out, "unified_trainer")
    expected = common.reference(common.plan(1, accumulate=2), sgd, accumulate=2, clip=("norm", 0.5))
    assert results[0]["weights"] == results[1]["weights"]
    assert jobs.max_difference(results[0]["weights"], expected) < TOL
    assert results[0]["strategy"] == "accord.lightning.unified"


def test_lightning_fabric(out):
    results = common.read(out, "unified_fabric")
    expected = common.reference(common.plan(1, shuffle=False), sgd, clip=("value", 0.05))
    assert results[0]["weights"] == results[1]["weights"]
    assert jobs.max_difference(results[0]["weights"], expected) < TOL
    assert results[0]["strategy"] == "accord.lightning.unified"
