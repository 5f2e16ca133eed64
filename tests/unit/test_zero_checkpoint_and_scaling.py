"""The pure parts of the sharded optimizer's DCP form and gradient scaling: DTensor's row split,
the checks on a loaded state dict, and global-norm clipping and the inf check over shards (with
a one-rank "allreduce", the identity, so torch's own functions give the expected values)."""
import math

import pytest
import torch

from accord.errors import ConfigError
from accord.torch.zero.checkpoint import check_names, row_span
from accord.torch.zero.scaling import clip_by_global_norm, has_nonfinite, scaler_attributes


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_rows_are_torch_chunk_split_padded_with_empty_ranks(world):
    for rows in range(13):
        chunks = list(torch.arange(rows).chunk(world)) if rows else []
        for rank in range(world):
            start, end = row_span(rows, world, rank)
            want = chunks[rank].tolist() if rank < len(chunks) else []
            assert list(range(start, end)) == want, (rows, world, rank)


def _groups(*names_per_group):
    return [{"lr": 0.1, "params": list(names)} for names in names_per_group]


def test_a_loaded_state_dict_must_name_the_optimizers_parameters():
    names = ["a", "b", "c"]
    mine = [{"params": [0, 1]}, {"params": [2]}]
    state = {"state": {"a": {}}, "param_groups": _groups(["a", "b"], ["c"])}
    assert check_names(state, names, mine) == state["param_groups"]
    cases = {
        "has 1 parameter groups, the optimizer has 2": {"state": {}, "param_groups": _groups(["a", "b", "c"])},
        "parameter group 1 of the state dict names the parameters ['d'], the optimizer's are ['c']":
            {"state": {}, "param_groups": _groups(["a", "b"], ["d"])},
        "state for parameters the optimizer does not have: ['z']":
            {"state": {"z": {}}, "param_groups": _groups(["a", "b"], ["c"])},
        "takes {'state': {name: {...}}, 'param_groups': [...]}, got dict with keys ['optim']": {"optim": {}},
    }
    for message, bad in cases.items():
        with pytest.raises(ConfigError) as info:
            check_names(bad, names, mine)
        assert message in str(info.value) and "HINT:" in str(info.value)


def _identity(tensor, op):
    return tensor.clone()


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clipping_shards_on_one_rank_is_torch_clip_grad_norm(norm_type):
    torch.manual_seed(0)
    grads = [torch.randn(7) * 3, torch.randn(5)]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(params, 0.5, norm_type)
    # an empty shard (a rank's span may be empty) and a missing one count for nothing
    got = clip_by_global_norm([grads[0], torch.zeros(0), None, grads[1]], 0.5, norm_type, _identity)
    torch.testing.assert_close(got, want)
    for p, g in zip(params, grads):
        torch.testing.assert_close(g, p.grad)


def test_nonfinite_check_and_scaler_attributes():
    assert not has_nonfinite([torch.ones(3), None, torch.arange(3)])  # (integer tensors are not checked)
    assert has_nonfinite([torch.ones(3), torch.tensor([0.0, float("nan")])])
    assert has_nonfinite([torch.tensor([float("-inf")])])
    assert has_nonfinite([torch.tensor([float("inf"), float("-inf")])])  # (their sum is a nan)
    # finite values whose sum overflows: checked element by element, and finite
    assert not has_nonfinite([torch.full((4,), 3e38), torch.full((8,), 6e4, dtype=torch.float16)])
    assert has_nonfinite([torch.full((4,), 3e38), torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)])
    assert not has_nonfinite([torch.zeros(0), torch.zeros(2, 0)])

    class Opt:
        pass

    opt = Opt()
    assert scaler_attributes(opt, shard_gradients=True) == {}
    opt.grad_scale, opt.found_inf = torch.tensor(8.0), torch.tensor(0.0)
    assert set(scaler_attributes(opt, shard_gradients=False)) == {"grad_scale", "found_inf"}
    with pytest.raises(ConfigError, match="HINT: use shard_gradients=False"):
        scaler_attributes(opt, shard_gradients=True)
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")  # (removed: stays usable)
