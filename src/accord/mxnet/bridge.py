"""MXNet NDArrays <-> the engine's torch tensors, without copies, respecting MXNet's engine.

MXNet runs operators asynchronously: an NDArray handed to Python may still be written by a
pending operator (a gradient still being computed by backward). The views made here wait
first, through MXNet's own DLPack export: ``to_dlpack_for_read`` waits for pending writes,
``to_dlpack_for_write`` for pending reads and writes. The torch tensor then shares the
NDArray's memory (CPU or GPU) until the caller is done with it. Every accord.mxnet collective
blocks until the engine has finished writing, so MXNet operators pushed after it can never see
a half-written result.

Results of unknown shape (allgather, alltoall, reducescatter) come back as torch tensors from
the engine and become NDArrays through ``mx.nd.from_dlpack`` (no copy either).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

from accord.errors import AccordError, with_hint

INSTALL_HINT = "pip install 'accord[mxnet]'"


def require_mxnet() -> Any:
    """Import and return the ``mxnet`` module.

    Raises:
        ImportError: MXNet is not installed (or does not import), with the install HINT.
    """
    try:
        import mxnet
    except Exception as exc:  # MXNet 1.9.1 with numpy >= 1.24 fails with AttributeError (np.bool)
        raise ImportError(with_hint(
            f"accord.mxnet needs MXNet 1.9.1, which could not be imported: "
            f"{type(exc).__name__}: {exc}",
            f"{INSTALL_HINT} (it pins mxnet==1.9.1 and numpy==1.23.5, which MXNet needs); "
            f"keep it in its own virtual environment if other packages need a newer numpy")) from exc
    return mxnet


mx = require_mxnet()

# MXNet's dtype names (and numpy's) -> torch dtypes, for checks and error messages.
TORCH_DTYPES = {
    "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
    "uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}


def is_ndarray(value: Any) -> bool:
    """True for an ``mx.nd.NDArray``, dense or sparse."""
    return isinstance(value, mx.nd.NDArray)


def ndarray_problem(value: Any, what: str) -> str:
    """What the collectives refuse in an argument ("" when nothing): a non-NDArray or a sparse
    NDArray. Returned, not raised: whether an argument is usable may differ between ranks, so
    the request carries the problem and every rank of the set raises it (see
    :mod:`accord.mxnet.mpi_ops`)."""
    if not is_ndarray(value):
        return with_hint(f"{what} takes an mxnet NDArray, got {type(value).__name__}",
                         "pass mx.nd.array(...) (accord.torch takes torch tensors)")
    if getattr(value, "stype", "default") != "default":
        return with_hint(f"{what} takes a dense NDArray, got storage type {value.stype!r}",
                         "convert it with .tostype('default')")
    return ""


def read_view(array: Any) -> torch.Tensor:
    """A torch tensor sharing ``array``'s memory, once every pending write to it has finished."""
    return torch.utils.dlpack.from_dlpack(array.to_dlpack_for_read())


def write_view(array: Any) -> torch.Tensor:
    """A torch tensor sharing ``array``'s memory, once every pending read and write of it has
    finished: the caller may overwrite it."""
    return torch.utils.dlpack.from_dlpack(array.to_dlpack_for_write())


def to_ndarray(tensor: torch.Tensor) -> Any:
    """An NDArray sharing ``tensor``'s memory (kept alive by the NDArray)."""
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.dtype == torch.bool:  # MXNet 1.x's legacy NDArray has no bool
        tensor = tensor.to(torch.uint8)
    return mx.nd.from_dlpack(torch.utils.dlpack.to_dlpack(tensor))


def is_sparse(value: Any) -> bool:
    """True for a row_sparse or csr NDArray (its DLPack view would hold only the stored rows)."""
    return is_ndarray(value) and getattr(value, "stype", "default") != "default"


def dense(array: Any) -> Any:
    """``array`` itself when dense, else its dense copy (what the engine and the store work on)."""
    return array.tostype("default") if is_sparse(array) else array


class DenseStandIns:
    """Sparse NDArrays (row_sparse gradients of ``Embedding(sparse_grad=True)``, say) handled
    through dense copies, because the engine and the store work on whole dense arrays:
    :meth:`dense` gives an NDArray itself when it is dense, else a dense copy;
    :meth:`write_back` then stores each copy into its sparse NDArray.

    A summed row_sparse gradient must hold every row some rank's gradient held, even a row whose
    sum is exactly zero: one process on the whole batch has that row in its gradient, and lazy
    optimizer updates (MXNet's default for row_sparse gradients) apply momentum and weight decay
    to exactly the rows present. :meth:`dense_with_rows` therefore also gives a row mask (1.0 for
    each row this rank's gradient holds) for the caller to sum over the ranks beside the values.
    """

    def __init__(self) -> None:
        self._pairs: list[tuple[Any, Any, Any]] = []

    def dense(self, array: Any) -> Any:
        """``array`` when dense, else a dense copy to be written back (with its nonzero rows)."""
        copy = dense(array)
        if copy is not array:
            self._pairs.append((array, copy, None))
        return copy

    def dense_with_rows(self, array: Any) -> tuple[Any, Any]:
        """``(dense form, row mask)``: the mask is None unless ``array`` is row_sparse; summed over
        the ranks in place, its nonzero entries name the rows :meth:`write_back` keeps."""
        if getattr(array, "stype", "default") != "row_sparse":
            return self.dense(array), None
        copy = array.tostype("default")
        mask = row_mask(array)
        self._pairs.append((array, copy, mask))
        return copy, mask

    def write_back(self) -> None:
        """Store each dense copy into its sparse NDArray: the rows its (summed) mask marks, or,
        without a mask, the rows that are not all zero."""
        for sparse, copy, mask in self._pairs:
            if mask is None:
                sparse[:] = copy.tostype(sparse.stype)
            else:
                sparse[:] = rows_of(copy, mask)
        self._pairs.clear()


def row_mask(array: Any) -> Any:
    """float32 vector over ``array``'s rows: 1.0 where its row_sparse storage holds the row."""
    mask = np.zeros(array.shape[0], dtype=np.float32)
    mask[array.indices.asnumpy()] = 1.0
    return mx.nd.array(mask, ctx=array.context, dtype="float32")


def rows_of(values: Any, rows: Any) -> Any:
    """A row_sparse NDArray holding the rows of dense ``values`` named by ``rows`` (row indices,
    or a mask NDArray whose nonzero entries mark them)."""
    if is_ndarray(rows):
        rows = np.flatnonzero(rows.asnumpy())
    indices = mx.nd.array(rows, ctx=values.context, dtype="int64")
    return mx.nd.sparse.row_sparse_array((mx.nd.take(values, indices), indices), shape=values.shape,
                                         ctx=values.context, dtype=values.dtype)


_ERROR_TYPES: dict[type, type] = {}


def mxnet_error(exc: BaseException) -> BaseException:
    """``exc`` as an error that is also an ``mx.base.MXNetError`` (Horovod's MXNet collectives
    fail with MXNetError), keeping its own class (``except HorovodInternalError`` still works)."""
    base = mx.base.MXNetError
    cls = type(exc)
    if isinstance(exc, base) or not isinstance(exc, AccordError):
        return exc
    both = _ERROR_TYPES.get(cls)
    if both is None:
        both = _ERROR_TYPES[cls] = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
    new = both.__new__(both)
    new.__dict__.update(exc.__dict__)
    new.args = exc.args
    return new
