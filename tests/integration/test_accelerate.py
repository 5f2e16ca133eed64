"""Hugging Face Accelerate on the accord torch.distributed backend (scripts/accelerate_train.py):
under ``accelerate launch`` and under accordrun, a 2-process CPU training ends with exactly the
weights it ends with on Gloo (and those of one process trained on the global batch); and the
``InitProcessGroupKwargs(backend="accord")`` spelling is refused on CPU, where the documented
route is to start the process group before the Accelerator (docs/accelerate.md)."""
import pytest
import torch
from helpers import framework_jobs as jobs

jobs.require("accelerate", "pip install 'accord[accelerate]'")

common = jobs.common()


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("accelerate"))
    jobs.succeeded(jobs.accelerate_launch("accelerate_train.py", folder, "accord", "accelerate", timeout=180))
    jobs.succeeded(jobs.accordrun("accelerate_train.py", folder, "accord", "accordrun", timeout=180))
    jobs.succeeded(jobs.accordrun("accelerate_train.py", folder, "gloo", "accordrun", timeout=180))
    return folder


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", ["accelerate", "accordrun"])
def test_same_weights_as_on_gloo(out, launcher):
    gloo = common.read(out, "accelerate-gloo-accordrun")
    results = common.read(out, f"accelerate-accord-{launcher}")
    assert [r["weights"] for r in results] == [gloo[0]["weights"]] * 2
    assert [(r["backend"], r["distributed_type"], r["processes"], r["gathered"]) for r in results] == \
        [("accord", "DistributedType.MULTI_CPU", 2, [0, 1])] * 2
    assert gloo[0]["backend"] == "gloo"
    # and what one process computes: accelerate hands batch k to process k % 2, in order
    batches = [list(range(4 * k, 4 * k + 4)) for k in range(10)]
    plan = [[[batches[2 * k], batches[2 * k + 1]]] for k in range(5)] * 2
    expected = common.reference(plan, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), clip=("norm", 0.5))
    assert jobs.max_difference(results[0]["weights"], expected) < 1e-10


@pytest.mark.timeout(120)
def test_backend_name_is_replaced_on_cpu(monkeypatch):
    # accelerate/state.py (1.16): on CPU, _prepare_backend sets any backend but "mpi" to "gloo",
    # then PartialState raises because it differs from the one asked for
    from accelerate.state import PartialState

    monkeypatch.setenv("LOCAL_RANK", "0")
    PartialState._reset_state()
    try:
        with pytest.raises(ValueError, match="backend accord is not available, please use gloo"):
            PartialState(cpu=True, backend="accord")
    finally:
        PartialState._reset_state()
