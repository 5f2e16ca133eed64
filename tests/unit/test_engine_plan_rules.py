"""Which steady cycles may run as a plan (accord/engine/cycle/plan.py), decided from signatures alone.

CUDA requests are planned too, with a larger bound for a lone request than on the CPU (a GPU
copies the staging bytes far faster than a negotiation takes). A CUDA signature is made here by
rewriting a CPU request's device: the rule reads nothing but the signature and the byte count.
"""
import torch

from accord.comm.ops import ReduceOp
from accord.engine.cycle.plan import LONE_MAX_BYTES, Planner, plannable
from accord.engine.request import Op, Request

THRESHOLD = 64 << 20


def _req(name, numel, device="cpu", dtype=torch.float32, op=ReduceOp.SUM, kind=Op.ALLREDUCE):
    r = Request(name, kind, torch.zeros(numel, dtype=dtype), reduce_op=op)
    r.signature = r.signature._replace(device=device)
    return r


def test_lone_request_bounds_per_device():
    cpu_max = LONE_MAX_BYTES["cpu"] // 4
    cuda_max = LONE_MAX_BYTES["cuda"] // 4
    assert LONE_MAX_BYTES["cuda"] > LONE_MAX_BYTES["cpu"]
    assert plannable([_req("a", cpu_max)], THRESHOLD) == (("a", _req("a", cpu_max).signature),)
    assert plannable([_req("a", cpu_max + 1)], THRESHOLD) is None
    assert plannable([_req("a", cpu_max + 1, "cuda")], THRESHOLD) is not None
    assert plannable([_req("a", cuda_max, "cuda")], THRESHOLD) is not None
    assert plannable([_req("a", cuda_max + 1, "cuda")], THRESHOLD) is None


def test_only_floating_sum_or_average_allreduce_on_known_devices():
    assert plannable([_req("a", 8, "cuda", op=ReduceOp.AVERAGE)], THRESHOLD) is not None
    assert plannable([_req("a", 8, "cuda", op=ReduceOp.MAX)], THRESHOLD) is None
    assert plannable([_req("a", 8, "cuda", dtype=torch.int32)], THRESHOLD) is None
    assert plannable([_req("a", 8, "cuda", kind=Op.BROADCAST)], THRESHOLD) is None
    assert plannable([_req("a", 8, "xpu")], THRESHOLD) is None
    assert plannable([], THRESHOLD) is None


def test_a_fused_first_item_is_planned_unless_the_communicator_scatters():
    batch = [_req("a", 1000, "cuda"), _req("b", 3000, "cuda")]
    first = plannable(batch, THRESHOLD)
    assert first is not None and [n for n, _ in first] == ["a", "b"]
    assert plannable(batch, THRESHOLD, scattered=True) is None


def test_planner_keeps_the_cpu_device_index_unset():
    planner = Planner()
    ready = [_req("a", 8)]
    for _ in range(3):
        planner.observe(True, [0], ready, THRESHOLD)
    assert planner.plan is not None and planner.plan.names == ("a",) and planner.plan.device_index == -1
    planner.leave()
    assert planner.plan is None
