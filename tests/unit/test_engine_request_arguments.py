"""A request's root and scale factors (accord/engine/request.py): numpy numbers are taken as
plain ones; anything else is refused in the request (its ``problem``, raised on every rank by the
negotiation) with a neutral value in the signature, which must still encode for the peers."""
import numpy as np
import torch

from accord.engine.request import Op, Request, Signature


def _roundtrip(r):
    return Signature.from_json(r.signature.to_json())


def test_numpy_root_and_scale_factors_are_plain_numbers():
    r = Request("b", Op.BROADCAST, torch.ones(2), root_rank=np.int64(1), prescale_factor=np.float32(2))
    assert r.problem == "" and type(r.root_rank) is int and r.root_rank == 1
    assert type(r.prescale_factor) is float and r.prescale_factor == 2.0
    assert _roundtrip(r) == r.signature


def test_a_root_that_is_no_int_is_refused_and_still_encodes():
    for root in (None, 0.0, "0", True):
        r = Request("b", Op.BROADCAST, torch.ones(2), root_rank=root)
        assert f"root_rank must be an int, got {root!r}" in r.problem and "HINT:" in r.problem
        assert r.signature.root == -1 and r.signature.problem == r.problem
        assert _roundtrip(r) == r.signature


def test_scale_factors_that_are_no_numbers_are_refused_and_still_encode():
    r = Request("a", Op.ALLREDUCE, torch.ones(2), prescale_factor="2", postscale_factor=None)
    assert "prescale_factor must be a number, got '2'" in r.problem  # the first problem is kept
    assert r.signature.prescale == 1.0 and r.signature.postscale == 1.0
    assert _roundtrip(r) == r.signature


def test_an_unrooted_op_ignores_its_root():
    r = Request("a", Op.ALLREDUCE, torch.ones(2), root_rank=None)
    assert r.problem == "" and r.signature.root == -1
