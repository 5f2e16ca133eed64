"""accord.mxnet (Horovod's MXNet API) on real ranks: every collective x dtype against numpy,
in-place variants, process sets, objects, parameter broadcast (deferred init included), errors.

Each test runs many checks inside one set of ranks (a rank with MXNet costs seconds to start).
Every rank rebuilds every rank's input from (seed, rank), so expected values come from numpy.
"""
import numpy as np
import pytest
from helpers.mxnet_env import require_mxnet
from helpers.ranks import run_ranks
from helpers.values import close, int_data

require_mxnet()

pytestmark = pytest.mark.timeout(150)

DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]


def _data(seed, rank, shape, dtype):
    values = int_data(seed, rank, shape, "float64")
    return (np.abs(values) if dtype == "uint8" else values).astype(dtype)


def _collectives(rank, size):
    import mxnet as mx

    import accord.mxnet as hvd

    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (rank, size, rank, size)
    assert (hvd.cross_rank(), hvd.cross_size(), hvd.is_initialized()) == (0, 1, True)
    everyone = range(size)
    # the engine's tensors are views of the NDArrays (DLPack), not copies
    from accord.mxnet.bridge import read_view, write_view

    shared = mx.nd.zeros((2, 3))
    write_view(shared).fill_(7)
    close(shared.asnumpy(), np.full((2, 3), 7))
    shared[:] = 3  # an MXNet write: the next view waits for it
    close(read_view(shared).numpy(), np.full((2, 3), 3))
    for i, dtype in enumerate(DTYPES):
        x = _data(i, rank, (5, 3), dtype)
        allx = [_data(i, r, (5, 3), dtype) for r in everyone]
        total = np.sum(allx, axis=0, dtype="float64")
        nd = mx.nd.array(x, dtype=dtype)
        # allreduce: sum, average (the default; integers truncate like Horovod), min, max, product
        out = hvd.allreduce(nd, average=False, name=f"sum.{dtype}")
        assert out.dtype == np.dtype(dtype) and out.shape == (5, 3)
        close(out.asnumpy(), total.astype(dtype))
        close(nd.asnumpy(), x)  # out-of-place: input untouched
        avg = hvd.allreduce(nd, name=f"avg.{dtype}").asnumpy()
        expected = total / size if "float" in dtype else np.trunc(total / size)
        close(avg, expected.astype(dtype), 1e-3 if dtype == "float16" else 0)
        for op, fn in ((hvd.Min, np.min), (hvd.Max, np.max), (hvd.Product, np.prod)):
            close(hvd.allreduce(nd, op=op).asnumpy(), fn(allx, axis=0).astype(dtype))
        scaled = hvd.allreduce(mx.nd.array(x, dtype=dtype), average=False, prescale_factor=2.0,
                               postscale_factor=0.5)
        close(scaled.asnumpy(), total.astype(dtype))
        inplace = mx.nd.array(x, dtype=dtype)
        assert hvd.allreduce_(inplace, average=False) is inplace
        close(inplace.asnumpy(), total.astype(dtype))
        # allgather with ragged first dimensions (rank r sends r + 1 rows)
        mine = _data(10 + i, rank, (rank + 1, 2), dtype)
        gathered = hvd.allgather(mx.nd.array(mine, dtype=dtype))
        close(gathered.asnumpy(), np.concatenate([_data(10 + i, r, (r + 1, 2), dtype) for r in everyone]))
        assert gathered.dtype == np.dtype(dtype)
        # broadcast from every root, out of place and in place
        for root in everyone:
            b = hvd.broadcast(nd, root_rank=root)
            close(b.asnumpy(), allx[root])
            close(nd.asnumpy(), x)
            c = mx.nd.array(x, dtype=dtype)
            hvd.broadcast_(c, root_rank=root, name=f"b_.{dtype}.{root}")
            close(c.asnumpy(), allx[root])
        # alltoall: rank r sends rows [k*.. ] to rank k; with splits also the received splits
        rows = np.arange(size * 2 * 3).reshape(size * 2, 3).astype(dtype) + rank
        got, received = hvd.alltoall(mx.nd.array(rows, dtype=dtype), splits=[2] * size)
        expected = np.concatenate([(np.arange(size * 2 * 3).reshape(size * 2, 3).astype(dtype) + r)
                                   [2 * rank:2 * rank + 2] for r in everyone])
        close(got.asnumpy(), expected)
        assert received.asnumpy().tolist() == [2] * size and received.dtype == np.int32
        assert hvd.alltoall(mx.nd.array(rows, dtype=dtype)).shape == (2 * size, 3)
        # reducescatter: this rank's rows of the sum
        big = _data(20 + i, rank, (2 * size, 2), dtype)
        red = hvd.reducescatter(mx.nd.array(big, dtype=dtype), op=hvd.Sum)
        full = np.sum([_data(20 + i, r, (2 * size, 2), dtype) for r in everyone], axis=0)
        close(red.asnumpy(), full[2 * rank:2 * rank + 2].astype(dtype))
    # grouped forms
    xs = [mx.nd.array(_data(40 + k, rank, (k + 1,), "float32")) for k in range(3)]
    sums = [np.sum([_data(40 + k, r, (k + 1,), "float32") for r in everyone], axis=0) for k in range(3)]
    for out, s in zip(hvd.grouped_allreduce(xs, average=False, name="g"), sums):
        close(out.asnumpy(), s)
    assert hvd.grouped_allreduce_(xs, average=False) is xs
    for out, s in zip(xs, sums):
        close(out.asnumpy(), s)
    assert hvd.grouped_allreduce([]) == []
    parts = hvd.grouped_allgather([mx.nd.ones((rank + 1, 2)), mx.nd.zeros((1,))])
    assert parts[0].shape == (sum(r + 1 for r in everyone), 2) and parts[1].shape == (size,)
    halves = hvd.grouped_reducescatter([mx.nd.ones((2 * size,)), mx.nd.ones((size, 2))], op=hvd.Average)
    close(halves[0].asnumpy(), np.ones(2))
    close(halves[1].asnumpy(), np.ones((1, 2)))
    # objects (pickled, sealed with the job secret)
    assert hvd.broadcast_object({"from": rank, "f": 1.5} if rank == 1 else None, root_rank=1) == \
        {"from": 1, "f": 1.5}
    assert hvd.allgather_object((rank, "x" * rank)) == [(r, "x" * r) for r in everyone]
    # process sets: a set of rank 0 alone, plus the global one
    solo = hvd.add_process_set([0])
    assert solo.size() == 1 and solo.included() == (rank == 0)
    if rank == 0:
        close(hvd.allreduce(mx.nd.ones(3) * 7, average=False, process_set=solo).asnumpy(), np.full(3, 7))
    close(hvd.allreduce(mx.nd.ones(2), average=False).asnumpy(), np.full(2, size))
    close(hvd.allreduce(mx.nd.ones(2), average=0).asnumpy(), np.full(2, size))  # c_bool(0): Sum
    assert hvd.remove_process_set(solo) and solo.process_set_id is None
    assert not hvd.remove_process_set(hvd.global_process_set)
    _parameters(rank, size)
    hvd.shutdown()
    assert not hvd.is_initialized()
    # init with sets that differ by rank (each names only itself): every rank gets both, with the
    # same ids (rank 0's first); a duplicate of the global set raises and leaves accord running
    own = hvd.ProcessSet([rank])
    hvd.init(process_sets=[own])
    assert own.process_set_id == rank + 1
    close(hvd.allreduce(mx.nd.ones(2) * (rank + 3), average=False, process_set=own).asnumpy(),
          np.full(2, rank + 3))
    with pytest.raises(ValueError, match="entry number 1 is a duplicate"):
        hvd.init(process_sets=[own, hvd.ProcessSet(list(everyone))])
    assert hvd.is_initialized()
    close(hvd.allreduce(mx.nd.ones(2), average=False).asnumpy(), np.full(2, size))
    hvd.shutdown()
    return True


def test_every_collective_and_dtype_against_numpy_and_parameter_broadcast():
    assert run_ranks(_collectives, 2, init="accord", timeout=140) == [True, True]


def _errors(rank, size):
    import mxnet as mx

    import accord.mxnet as hvd
    from accord.errors import MismatchError

    with pytest.raises(ValueError, match="not been initialized"):
        hvd.rank()
    with pytest.raises(hvd.HorovodInternalError):
        hvd.allreduce(mx.nd.ones(2))
    hvd.init()
    # shapes that differ between ranks: every rank raises (never hangs), as accord's error and
    # as MXNet's (Horovod's MXNet ops raise MXNetError)
    for fn in (lambda t: hvd.allreduce(t, name="bad"), lambda t: hvd.broadcast_(t, 0, name="badb")):
        with pytest.raises(MismatchError) as info:
            fn(mx.nd.ones((rank + 2,)))
        assert isinstance(info.value, mx.base.MXNetError)
        assert isinstance(info.value, hvd.HorovodInternalError)
        assert "shape" in str(info.value)
    # dtypes that differ
    with pytest.raises(mx.base.MXNetError, match="dtype"):
        hvd.allreduce(mx.nd.ones(2, dtype="float32" if rank else "float64"), name="bad_dtype")
    with pytest.raises(mx.base.MXNetError, match="takes an mxnet NDArray"):  # on every rank
        hvd.allreduce(np.ones(2))
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(mx.nd.ones(2), average=True, op=hvd.Sum)
    # alltoall without splits on a dim 0 that the ranks cannot share evenly: every rank raises
    # Horovod's kind of error (RuntimeError, MXNetError), still a ValueError as before
    with pytest.raises(RuntimeError, match=rf"dim 0 \({size + 1}\) is not divisible") as info:
        hvd.alltoall(mx.nd.ones((size + 1, 2)), name="uneven")
    assert isinstance(info.value, ValueError) and isinstance(info.value, mx.base.MXNetError)
    # splits: an NDArray must hold int32 (Horovod's core refuses other dtypes), and be 1-D;
    # refused on every rank of the set (test_mxnet_refused_arguments.py: one rank alone)
    rows = mx.nd.ones((2 * size, 2))
    for bad in (mx.nd.ones(size, dtype="float32") * 2, mx.nd.ones(size, dtype="int64") * 2):
        with pytest.raises(mx.base.MXNetError, match="32-bit integers") as info:
            hvd.alltoall(rows, splits=bad)
        assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    with pytest.raises(ValueError, match=rf"must be 1-D, got shape \(1, {size}\)"):
        hvd.alltoall(rows, splits=[[2] * size])
    # what Horovod accepts: int32 NDArrays, and lists (numbers truncated to integers)
    for good in (mx.nd.ones(size, dtype="int32") * 2, [2.9] * size):
        out, received = hvd.alltoall(mx.nd.ones((2 * size, 2)) * rank, splits=good)
        close(out.asnumpy(), np.repeat(np.arange(size, dtype="float32"), 2)[:, None] * np.ones(2))
        assert received.asnumpy().tolist() == [2] * size
    # the engine still works after the errors
    close(hvd.allreduce(mx.nd.ones(2), average=False).asnumpy(), np.full(2, size))
    hvd.shutdown()
    return True


def test_mismatched_shapes_raise_on_every_rank():
    assert run_ranks(_errors, 2, init="accord", timeout=120) == [True, True]


def test_compression_works_on_ndarrays_like_horovods():
    """hvd.Compression.none/.fp16 take and return NDArrays (Horovod's MXNet interface); the
    trainer hands the engine its own compressor for them, and runs any other on the NDArrays."""
    import mxnet as mx

    import accord.mxnet as hvd
    from accord.engine import compression as engine
    from accord.mxnet.compression import engine_compressor

    values = np.arange(12).reshape(4, 3) / 8  # exact in float16
    for dtype in ("float16", "float32", "float64"):
        array = mx.nd.array(values, dtype=dtype)
        wire, ctx = hvd.Compression.fp16.compress(array)
        assert wire.dtype == np.float16
        back = hvd.Compression.fp16.decompress(wire, ctx)
        assert back.dtype == np.dtype(dtype)
        close(back.asnumpy(), values)
    for dtype in ("uint8", "int8", "int32", "int64"):  # not floating: sent unchanged
        array = mx.nd.array(np.arange(6), dtype=dtype)
        wire, ctx = hvd.Compression.fp16.compress(array)
        assert wire.dtype == np.dtype(dtype)
        back = hvd.Compression.fp16.decompress(wire, ctx)
        assert back.dtype == np.dtype(dtype)
        close(back.asnumpy(), np.arange(6))
    array = mx.nd.ones(3)
    wire, ctx = hvd.Compression.none.compress(array)
    assert wire is array and hvd.Compression.none.decompress(wire, ctx) is array
    with pytest.raises(TypeError, match="no bfloat16 NDArrays"):
        hvd.Compression.bf16.compress(array)
    assert engine_compressor(hvd.Compression.fp16) is engine.FP16Compressor
    assert engine_compressor(hvd.Compression.bf16) is engine.BF16Compressor
    assert engine_compressor(hvd.Compression.none) is engine.NoneCompressor
    assert engine_compressor(engine.FP16Compressor) is engine.FP16Compressor

    class Own(hvd.Compressor):
        pass

    assert engine_compressor(Own) is None


def _parameters(rank, size):
    """broadcast_parameters: a Gluon ParameterDict with deferred-init parameters, a dict."""
    import mxnet as mx

    import accord.mxnet as hvd

    mx.random.seed(100 + rank)  # different initial weights on every rank
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, in_units=3), mx.gluon.nn.Dense(2))  # the second: deferred init
    net.initialize(mx.init.Uniform())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=1)
    net(mx.nd.ones((1, 3)))  # runs the deferred initialization, which then broadcasts
    mine = {k: v.data().asnumpy() for k, v in params.items()}
    both = hvd.allgather_object(mine)
    for name in mine:
        close(both[0][name], both[1][name])
    # a plain dict of NDArrays (Module.get_params()) with a prefix
    arrays = {"a": mx.nd.ones(3) * rank, "b": mx.nd.ones((2, 2)) * (rank + 5)}
    hvd.broadcast_parameters(arrays, root_rank=0, prefix="dict.")
    close(arrays["a"].asnumpy(), np.zeros(3))
    close(arrays["b"].asnumpy(), np.full((2, 2), 5))
    with pytest.raises(ValueError, match="invalid params"):
        hvd.broadcast_parameters([mx.nd.ones(1)])
