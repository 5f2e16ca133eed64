"""accord.torch without starting any rank: names, constants, errors before init, pure helpers."""
import warnings

import numpy as np
import pytest
import torch

import accord.torch as hvd
from accord.engine.naming import RequestNamer
from accord.errors import CollectiveError
from accord.torch import adasum, gateway
from accord.torch.async_ops import handle_average_backwards_compatibility
from accord.torch.grad_reduction import split_list

pytestmark = pytest.mark.timeout(30)

HOROVOD_TORCH_NAMES = """
init shutdown is_initialized size local_size cross_size rank local_rank cross_rank
mpi_enabled mpi_built gloo_enabled gloo_built nccl_built cuda_built rocm_built ddl_built ccl_built
mpi_threads_supported start_timeline stop_timeline Average Sum Adasum Min Max Product
allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
grouped_allreduce_async grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async
grouped_allgather grouped_allgather_async broadcast broadcast_ broadcast_async broadcast_async_
alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async poll synchronize join barrier HorovodInternalError ProcessSet
global_process_set add_process_set remove_process_set Compression broadcast_parameters
broadcast_optimizer_state broadcast_object allgather_object DistributedOptimizer SyncBatchNorm
""".split()


def test_every_horovod_name_exists():
    missing = [n for n in HOROVOD_TORCH_NAMES if not hasattr(hvd, n)]
    assert missing == []
    assert set(HOROVOD_TORCH_NAMES) <= set(hvd.__all__)


def test_reduce_op_values_are_horovods():
    assert [int(hvd.Average), int(hvd.Sum), int(hvd.Adasum), int(hvd.Min), int(hvd.Max),
            int(hvd.Product)] == [0, 1, 2, 3, 4, 5]
    assert hvd.Average == 0 and hvd.Sum == 1


def test_internal_error_is_a_runtime_error():
    assert hvd.HorovodInternalError is CollectiveError
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


@pytest.mark.parametrize("query", ["size", "local_size", "cross_size", "rank", "local_rank",
                                   "cross_rank", "is_homogeneous"])
def test_queries_before_init_raise_horovods_value_error(query):
    assert not hvd.is_initialized()
    with pytest.raises(ValueError) as info:
        getattr(hvd, query)()
    assert str(info.value) == "Horovod has not been initialized; use hvd.init()."


def test_timeline_and_ops_before_init():
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.start_timeline("/tmp/never.json")
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.stop_timeline()
    with pytest.raises(hvd.HorovodInternalError, match="not been initialized"):
        hvd.allreduce(torch.ones(2))
    with pytest.raises(hvd.HorovodInternalError, match="not been initialized"):
        hvd.alltoall(torch.ones(2))
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.join()


def test_build_flags():
    assert hvd.gloo_built() is True
    assert hvd.gloo_enabled() is True  # default ACCORD_CPU_BACKEND
    assert hvd.mpi_enabled() is False
    assert isinstance(hvd.mpi_built(), bool)
    assert hvd.nccl_built() == 0 or hvd.nccl_built() > 1000
    assert hvd.cuda_built() == (torch.version.cuda is not None)
    assert hvd.ddl_built() is False and hvd.ccl_built() is False and hvd.rocm_built() is False
    with pytest.raises(ValueError, match="MPI is not enabled"):
        hvd.mpi_threads_supported()


def test_average_argument_compatibility():
    assert handle_average_backwards_compatibility(None, None) == hvd.Average
    assert handle_average_backwards_compatibility(hvd.Max, None) == hvd.Max
    with pytest.warns(DeprecationWarning, match="`average` has been replaced with `op`"):
        assert handle_average_backwards_compatibility(None, False) == hvd.Sum
    with pytest.warns(DeprecationWarning):
        assert handle_average_backwards_compatibility(None, True) == hvd.Average
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        handle_average_backwards_compatibility(hvd.Sum, True)


def test_names_follow_horovod_and_are_scoped_per_process_set():
    names = RequestNamer()  # the session's: the facade passes "allreduce.<name>" when named
    assert names.name("allreduce", "allreduce.grad.w", 0) == "allreduce.grad.w"
    assert names.name("broadcast", "broadcast.x", 2) == "broadcast.x@ps2"
    a = names.name("allreduce", None, 0)
    b = names.name("allgather", None, 0)  # one counter per process set, whatever the op
    c = names.name("allgather", None, 5)
    assert (a, b) == ("allreduce.noname.1", "allgather.noname.2")
    assert c == "allgather.noname.1@ps5"  # other sets' calls do not shift its numbers
    assert names.group("allreduce", "allreduce.g", 3, 0) == ["allreduce.g_1of3", "allreduce.g_2of3",
                                                             "allreduce.g_3of3"]
    assert names.group("allgather", None, 2, 5) == ["allgather.noname.2_1of2@ps5",
                                                    "allgather.noname.2_2of2@ps5"]


def test_tensor_problem_names_what_horovod_rejects():
    # Not raised at submission: the request carries it to every rank (test_mismatch_matrix.py)
    assert gateway.tensor_problem(torch.ones(3, 4).t(), "allreduce").startswith(
        "Tensor is required to be contiguous. (shape [4, 3], strides [1, 4])\nHINT:")
    assert "allreduce expects a torch.Tensor, got list" in gateway.tensor_problem([1, 2], "allreduce")
    assert "does not take sparse tensors" in gateway.tensor_problem(torch.ones(2).to_sparse(), "allreduce")
    assert gateway.tensor_problem(torch.ones(2), "allreduce") == ""
    assert gateway.wire([1, 2]).shape == (0,)  # what a refused non-tensor submits


def test_unknown_handles():
    assert hvd.synchronize(987654321) is None
    with pytest.raises(ValueError, match="was not created or has been cleared"):
        hvd.poll(987654321)


def test_split_list_matches_horovods_split():
    assert split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_list([1, 2], 4) == [[1], [2], [], []]


_DBL_MIN_SQRT = 1.4916681462400413e-154  # sqrt(DBL_MIN): Horovod 0.28's zero-norm guard


def _np_adasum(a, b):
    d = a @ b
    ca = 1 - d / (2 * (a @ a)) if a @ a >= _DBL_MIN_SQRT else 1.0
    cb = 1 - d / (2 * (b @ b)) if b @ b >= _DBL_MIN_SQRT else 1.0
    return ca * a + cb * b


def test_adasum_tree_against_numpy():
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=6) for _ in range(4)]
    want = _np_adasum(_np_adasum(rows[0], rows[1]), _np_adasum(rows[2], rows[3]))
    got = adasum.combine_tree([torch.from_numpy(r) for r in rows])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    # orthogonal vectors add up, identical ones average, zero vectors leave the other alone
    e1, e2 = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 2.0], dtype=torch.float64)
    assert adasum.combine_pair(e1, e2).tolist() == [1.0, 2.0]
    assert adasum.combine_pair(e2, e2).tolist() == [0.0, 2.0]
    assert adasum.combine_pair(e1, torch.zeros(2, dtype=torch.float64)).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="power-of-two"):
        adasum.combine_tree([e1, e1, e1])


def test_adasum_combines_small_gradients_too():
    """Identical gradients average however small they are (Horovod 0.28 treats only squared
    norms below sqrt(DBL_MIN) as zero): 1e-5 everywhere (|g|^2 = 4e-10) stays 1e-5, not 2e-5;
    orthogonal small ones still add up; a vector of exact zeros leaves the other as it is."""
    small = torch.full((4,), 1e-5, dtype=torch.float64)
    np.testing.assert_allclose(adasum.combine_pair(small, small).numpy(), np.full(4, 1e-5), rtol=1e-12)
    np.testing.assert_allclose(adasum.combine_tree([small] * 4).numpy(), np.full(4, 1e-5), rtol=1e-12)
    e1, e2 = torch.tensor([1e-7, 0.0], dtype=torch.float64), torch.tensor([0.0, 3e-7], dtype=torch.float64)
    assert adasum.combine_pair(e1, e2).tolist() == [1e-7, 3e-7]
    assert adasum.combine_pair(e1, torch.zeros(2, dtype=torch.float64)).tolist() == [1e-7, 0.0]
    rng = np.random.default_rng(3)
    rows = [rng.normal(size=5) * 1e-6 for _ in range(2)]
    np.testing.assert_allclose(adasum.combine_pair(*(torch.from_numpy(r) for r in rows)).numpy(),
                               _np_adasum(*rows), rtol=1e-12)


def test_process_set_objects():
    ps = hvd.ProcessSet([3, 1, 2])
    assert ps.ranks == [1, 2, 3] and ps.process_set_id is None
    assert ps.size() is None and ps.rank() is None and ps.included() is None
    assert "ranks=[1, 2, 3]" in str(ps)
    with pytest.raises(ValueError, match="list of process ranks"):
        hvd.ProcessSet([0, "1"])
    with pytest.raises(ValueError, match="list of process ranks"):
        hvd.ProcessSet(42)
    assert hvd.remove_process_set(ps) is False
    assert hvd.global_process_set.process_set_id == 0
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.add_process_set([0])


def test_argument_errors_before_any_communication(monkeypatch, tmp_path):
    # torch's first optimizer imports its compiler stack, which sets this variable once;
    # setting it here lets monkeypatch restore the environment afterwards.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="invalid params of type"):
        hvd.broadcast_parameters((p for p in [torch.ones(1)]), root_rank=0)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 backward_passes_per_step=0)
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)


def test_compression_round_trip():
    x = torch.linspace(-3, 3, 11)
    for comp, tol in [(hvd.Compression.none, 0), (hvd.Compression.fp16, 1e-3), (hvd.Compression.bf16, 2e-2)]:
        wire, ctx = comp.compress(x)
        back = comp.decompress(wire, ctx)
        assert back.dtype == torch.float32
        np.testing.assert_allclose(back.numpy(), x.numpy(), atol=tol)
    assert hvd.Compression.fp16.compress(x)[0].dtype == torch.float16
    assert hvd.Compression.bf16.compress(x)[0].dtype == torch.bfloat16
    assert issubclass(hvd.Compression.fp16, hvd.Compressor)


def test_sync_batch_norm_without_init_is_plain_batch_norm():
    torch.manual_seed(0)
    x = torch.randn(6, 3, 4)
    sync, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(sync(x).detach().numpy(), plain(x).detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(sync.running_var.numpy(), plain.running_var.numpy(), atol=1e-6)
