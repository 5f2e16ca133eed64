"""Deferred cast compression: in-place fp16/bf16-compressed allreduces that the engine casts
while it moves the data, on the shm backend (cast into and out of the shared slots) and on
Gloo (cast while packing the fusion buffer), lone and fused, mixed with requests that already
are in the wire dtype, with scale factors and Average.

Inputs are whole numbers plus 2**-10: the fraction is lost in bfloat16, so the expected sums, computed here
with plain Python arithmetic, tell whether the data really travelled in the narrow dtype.
"""
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)

FRACTION = 2.0 ** -10


def _whole(rank, k, n):
    """Rank ``rank``'s whole-number part for tensor ``k``: values 1..4 (exact in bf16)."""
    return [float(1 + (rank + k + i) % 4) for i in range(n)]


def _wire_cast_checks(rank, size):
    import torch

    from accord.comm.ops import ReduceOp
    from accord.engine import session
    from accord.engine.compression import Compression

    session.init()
    backend = session.backend_name()

    def summed(k, n, scale=1.0):
        rows = [_whole(r, k, n) for r in range(size)]
        return [scale * sum(column) for column in zip(*rows)]

    # 1. one lone request (no batch): bfloat16 drops the fraction on every rank
    x = torch.tensor(_whole(rank, 0, 7)) + FRACTION
    got = session.synchronize(session.submit("allreduce", x, "lone", in_place=True,
                                             compression=Compression.bf16))
    assert got is x and x.dtype == torch.float32
    assert x.tolist() == summed(0, 7)

    # 2. a fused batch with Average and scale factors: sum in bf16, then the scaling in float32
    xs = [torch.tensor(_whole(rank, k, 300 + k)) + FRACTION for k in range(1, 6)]
    hs = [session.submit("allreduce", t, f"batch.{k}", in_place=True, compression=Compression.bf16,
                         reduce_op=ReduceOp.AVERAGE, prescale_factor=2.0, postscale_factor=0.5)
          for k, t in enumerate(xs, start=1)]
    for k, (t, h) in enumerate(zip(xs, hs), start=1):
        assert session.synchronize(h) is t
        # gloo scales the bf16 fusion buffer, shm the float32 outputs: bf16's precision
        assert t.tolist() == pytest.approx(summed(k, 300 + k, 2.0 * 0.5 / size), rel=1e-2)

    # 3. a batch mixing deferred casts with tensors that already are bfloat16 (same fusion key)
    own = torch.tensor(_whole(rank, 7, 40)).to(torch.bfloat16)
    deferred = torch.tensor(_whole(rank, 8, 50)) + FRACTION
    h1 = session.submit("allreduce", own, "mixed.own", in_place=True)
    h2 = session.submit("allreduce", deferred, "mixed.cast", in_place=True, compression=Compression.bf16)
    assert session.synchronize(h1).float().tolist() == summed(7, 40)
    assert session.synchronize(h2).tolist() == summed(8, 50)

    # 4. float64 through float16 (halves are exact in both)
    y = torch.tensor(_whole(rank, 9, 11), dtype=torch.float64) + 0.5
    session.synchronize(session.submit("allreduce", y, "fp16", in_place=True, compression=Compression.fp16))
    assert y.dtype == torch.float64
    assert y.tolist() == [v + size * 0.5 for v in summed(9, 11)]

    # 5. a large batch spanning many shm chunks (1 MiB slots) with pieces that straddle them
    big = [torch.tensor(_whole(rank, 10 + k, 200_003)) + FRACTION for k in range(3)]
    hs = [session.submit("allreduce", t, f"big.{k}", in_place=True, compression=Compression.bf16)
          for k, t in enumerate(big)]
    for k, (t, h) in enumerate(zip(big, hs)):
        session.synchronize(h)
        assert t.tolist() == summed(10 + k, 200_003)

    # 6. the uncompressed path of the same shapes still sums in float32 (fraction kept)
    z = torch.tensor(_whole(rank, 20, 9)) + FRACTION
    session.synchronize(session.submit("allreduce", z, "plain", in_place=True))
    assert z.tolist() == [v + size * FRACTION for v in summed(20, 9)]

    wire_buffers = dict(session._current().wire_buffers)
    session.shutdown()
    assert wire_buffers == {}  # deferred casts need no per-name wire buffer
    return backend


@pytest.mark.parametrize("backend,nprocs", [("shm", 2), ("shm", 3), ("gloo", 2)])
def test_deferred_cast_allreduce(backend, nprocs):
    env = {"ACCORD_CPU_BACKEND": backend}
    assert run_ranks(_wire_cast_checks, nprocs, init="accord", env=env, timeout=80) == [backend] * nprocs


def _optimizer_checks(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(30, 20)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.bf16)
    # gradients whose exact average has a fraction bf16 cannot hold: w.grad = whole + 2**-10
    for step in range(2):
        opt.zero_grad()
        for p in model.parameters():
            p.grad = torch.full_like(p, float(rank + 1 + step)) + FRACTION
        opt.step()
        want = sum(float(r + 1 + step) for r in range(size)) / size
        for p in model.parameters():
            assert p.grad.dtype == torch.float32
            assert p.grad.unique().tolist() == [want]
    from accord.engine import session
    assert not hasattr(opt, "_wire_buffers")  # the optimizer keeps no compressed copies
    assert session._current().wire_buffers == {}  # nor the engine: it cast while moving the data
    hvd.shutdown()
    return True


def test_optimizer_bf16_casts_in_the_engine():
    assert run_ranks(_optimizer_checks, 2, init="accord", timeout=60) == [True, True]
