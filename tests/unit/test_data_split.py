"""split_batch / slice_bounds follow MXNet's _split_input_slice rule exactly."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from accord.data.split import slice_bounds, split_batch
from tests.helpers.mxnet_split import mxnet_slice_bounds

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "batch_size, weights, expected",
    [
        (10, [1, 1, 1], [(0, 3), (3, 6), (6, 10)]),  # 3.33 -> 3, 3, last takes 4
        (8, [3, 1], [(0, 6), (6, 8)]),
        (7, [1, 1], [(0, 4), (4, 7)]),  # 3.5 rounds half to even -> 4
        (5, [1, 1], [(0, 2), (2, 5)]),  # 2.5 -> 2 (banker's rounding, as Python 3 MXNet)
        (10, [1, 1, 1, 1, 1, 1], None),  # 1.67 -> 2 each: the sixth share is empty
        (100, [0.5, 0.25, 0.25], [(0, 50), (50, 75), (75, 100)]),
        (9, [2, 2, 2, 1], None),  # 2.57 -> 3, 3, 3 fill the batch: the last share is empty
    ],
)
def test_slice_bounds_hand_computed(batch_size, weights, expected):
    if expected is None:
        with pytest.raises(ValueError, match="Too many slices") as info:
            slice_bounds(batch_size, weights)
        assert "HINT:" in str(info.value) and str(batch_size) in str(info.value)
    else:
        assert slice_bounds(batch_size, weights) == expected


def test_slice_bounds_matches_rule_on_many_cases():
    rng = np.random.default_rng(0)
    for _ in range(500):
        k = int(rng.integers(1, 6))
        weights = [float(x) for x in rng.uniform(0.1, 3.0, size=k)]
        batch = int(rng.integers(k, 200))
        expected = mxnet_slice_bounds(batch, weights)
        if any(b >= e for b, e in expected):
            with pytest.raises(ValueError):
                slice_bounds(batch, weights)
            continue
        got = slice_bounds(batch, weights)
        assert got == expected
        assert got[0][0] == 0 and got[-1][1] == batch
        assert all(got[i][1] == got[i + 1][0] for i in range(k - 1))


@pytest.mark.parametrize("bad", [[], [1, 0], [1, -2], [float("nan"), 1], [True, 1], ["a"]])
def test_bad_work_load_list(bad):
    with pytest.raises(ValueError, match="HINT:"):
        slice_bounds(10, bad)


def test_too_many_slices_and_bad_batch():
    with pytest.raises(ValueError, match="Too many slices"):
        slice_bounds(2, [1, 1, 1])
    with pytest.raises(ValueError, match="Too many slices"):
        slice_bounds(0, [1])
    with pytest.raises(ValueError, match="batch_size"):
        slice_bounds(-1, [1])


def test_split_tensor_numpy_list_tuple_dict():
    t = torch.arange(20).view(10, 2)
    parts = split_batch(t, [1, 1, 1])
    assert [p.shape[0] for p in parts] == [3, 3, 4]
    assert torch.equal(torch.cat(parts), t)
    assert parts[1].data_ptr() == t[3:].data_ptr()  # a view, not a copy

    a = np.arange(8.0)
    parts = split_batch(a, [3, 1])
    np.testing.assert_array_equal(parts[0], a[:6])
    np.testing.assert_array_equal(parts[1], a[6:])

    assert split_batch(list(range(6)), [2, 1]) == [[0, 1, 2, 3], [4, 5]]
    assert split_batch(tuple("abcde"), [1, 1]) == [("a", "b"), ("c", "d", "e")]

    batch = {"data": torch.ones(5, 3), "label": np.arange(5)}
    parts = split_batch(batch, [1, 1])
    assert parts[0]["data"].shape == (2, 3) and list(parts[1]["label"]) == [2, 3, 4]


def test_split_errors():
    with pytest.raises(ValueError, match="no first dimension"):
        split_batch(torch.tensor(3.0), [1])
    with pytest.raises(ValueError, match="different first dimensions"):
        split_batch({"x": np.zeros(4), "y": np.zeros(5)}, [1, 1])
    with pytest.raises(ValueError, match="Too many slices"):
        split_batch(torch.zeros(2, 3), [1, 1, 1])
