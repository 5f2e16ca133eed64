"""What a sharded optimizer refuses (the pure parts: comparing signatures, refusing optimizers)."""
import pytest
import torch

from accord.torch.zero.checks import check_optimizer, first_difference, signature


def _sig(*shapes, dtype=torch.float32):
    return signature([(f"p{i}", torch.zeros(s, dtype=dtype)) for i, s in enumerate(shapes)], [0] * len(shapes))


def test_identical_signatures_pass_and_the_first_difference_is_named():
    assert first_difference([_sig((2, 3), (4,))] * 3) == ""
    assert first_difference([_sig((2, 3), (4,)), _sig((2, 3), (4,)), _sig((2, 3), (5,))]) == (
        "parameter #1 ('p1' on rank 0) has a different shape (rank 0: (4,), rank 1: (4,), rank 2: (5,))")
    assert "number of parameters differs between ranks (rank 0: 2, rank 1: 1)" in first_difference(
        [_sig((2,), (2,)), _sig((2,))])
    assert "different dtype (rank 0: 'float32', rank 1: 'float16')" in first_difference(
        [_sig((2,)), _sig((2,), dtype=torch.float16)])


def test_groups_and_requires_grad_are_part_of_the_signature():
    p = torch.zeros(3, requires_grad=True)
    q = torch.zeros(3)
    assert "different requires_grad" in first_difference([signature([("w", p)], [0]), signature([("w", q)], [0])])
    assert "different parameter group" in first_difference([signature([("w", p)], [0]), signature([("w", p)], [1])])


@pytest.mark.parametrize("cls", [torch.optim.LBFGS, torch.optim.SparseAdam])
def test_coupled_optimizers_are_refused_with_a_hint(cls):
    with pytest.raises(ValueError, match=f"(?s)cannot shard {cls.__name__}.*HINT"):
        check_optimizer(cls([torch.zeros(2, requires_grad=True)]))


def test_elementwise_optimizers_pass():
    for opt in (torch.optim.Adam, torch.optim.SGD, torch.optim.RMSprop, torch.optim.Adagrad):
        check_optimizer(opt([torch.zeros(2, requires_grad=True)], lr=0.1))
