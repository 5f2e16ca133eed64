"""Out-of-place allreduces fused into one collective: every result is a tensor of its own (not
a view of the fusion buffer or of another result), right on every rank, and untouched by later
steps. Two real ranks over Gloo; expected values computed from each rank's inputs."""
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)

SHAPES = [(3,), (2, 5), (7,), (4, 1, 2), (1,), (6, 3)]


def _fused_out_of_place(rank, size):
    import torch
    from helpers.engine_comm import start_engine

    from accord.engine.request import Op, build_request

    eng = start_engine(rank, size)
    steps = []
    for step in range(3):
        tensors = [torch.arange(torch.Size(s).numel(), dtype=torch.float64 if i % 2 else torch.float32)
                   .reshape(s) * (rank + 1) + step for i, s in enumerate(SHAPES)]
        reqs = [build_request(Op.ALLREDUCE, t, f"t{i}") for i, t in enumerate(tensors)]
        handles = eng.enqueue_many(reqs)  # one group: fused by dtype
        steps.append([eng.synchronize(h) for h in handles])
    buffers = eng._global.executor.buffers
    results = [r for step in steps for r in step]
    storages = {r.untyped_storage().data_ptr() for r in results}
    out = {"values": [[r.tolist() for r in step] for step in steps],
           "shapes": [tuple(r.shape) for r in steps[0]],
           "own_storage": len(storages) == len(results) and not any(buffers.owns(r) for r in results),
           "collectives": eng.stats()["collectives"]}
    eng.shutdown()
    return out


def test_fused_out_of_place_results_are_separate_tensors_with_right_values():
    import torch

    for res in run_ranks(_fused_out_of_place, 2, timeout=60):
        assert res["own_storage"]
        assert res["shapes"] == SHAPES
        for step, values in enumerate(res["values"]):
            for i, (s, got) in enumerate(zip(SHAPES, values)):
                n = torch.Size(s).numel()
                expected = (torch.arange(n, dtype=torch.float64).reshape(s) * 3 + 2 * step).tolist()
                assert got == expected, (step, i)
        assert res["collectives"] <= 2 * 3  # fused: one collective per dtype and step
