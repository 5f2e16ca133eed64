"""How each (dtype, reduce op) pair is carried out on a library that lacks some of them.

A backend states which pairs its library reduces natively (``native(dtype, op)``, for the four
library ops SUM/MIN/MAX/PRODUCT). :func:`plan_reduction` turns any request into a
:class:`ReducePlan`: reinterpret or cast the tensor into a *wire* tensor the library can reduce,
run one library op, then divide (AVERAGE) and convert back. The semantics, identical on every
backend:

- AVERAGE = SUM, then divide by the number of ranks. Integers: the sum is taken in int64 (no
  wrap-around below 64 bits) and the quotient truncated toward zero, as Horovod does (it scales
  by 1/size in double precision and casts back to the integer type). uint64 AVERAGE is refused.
- bool: SUM and MAX are logical or, MIN and PRODUCT logical and; AVERAGE is refused.
- float16 / bfloat16 / float8: reduced natively where the library can, else in float32 and
  rounded back once.
- complex: SUM/AVERAGE on the real view; PRODUCT natively (MPI) or by gathering every rank's
  tensor and multiplying locally (a complex product is not the product of real and imaginary
  parts); MIN/MAX are refused (complex numbers are not ordered).
- Integer SUM/PRODUCT wrap around like the native type; types the library lacks are widened
  (uint16, int16 -> int32; uint32 -> int64) or reinterpreted (uint64 as int64, with the sign
  bit flipped for MIN/MAX so that the signed order equals the unsigned one).
- BAND/BOR/BXOR: integers and bool only (bool as uint8 bytes, the other unsigned types as the
  signed type of their width: the bits are the same); natively where the library has them, else
  by gathering every rank's tensor and folding locally.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from accord.comm.ops import BITWISE_OPS, ReduceOp
from accord.errors import BackendError, with_hint

LIBRARY_OPS = (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
# Folding a stack of every rank's tensors (dim 0) where no library op fits.
_FOLDS = {ReduceOp.PRODUCT: lambda x: x.prod(dim=0),
          ReduceOp.BAND: lambda x: _fold_pairwise(x, torch.bitwise_and),
          ReduceOp.BOR: lambda x: _fold_pairwise(x, torch.bitwise_or),
          ReduceOp.BXOR: lambda x: _fold_pairwise(x, torch.bitwise_xor)}

# A stable code per dtype, so ranks can compare dtypes inside an integer header.
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "complex64", "complex128", "complex32",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2",
)
DTYPES: tuple[torch.dtype, ...] = tuple(getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n))
_CODES = {dt: i for i, dt in enumerate(DTYPES)}

_UNSIGNED = {getattr(torch, n) for n in ("uint8", "uint16", "uint32", "uint64") if hasattr(torch, n)}
_SIGNED = {torch.int8, torch.int16, torch.int32, torch.int64}
# Wider types that hold every value of the key type (tried in order when the key is not native).
_WIDER = {
    torch.int8: (torch.int16, torch.int32, torch.int64),
    torch.uint8: (torch.int16, torch.int32, torch.int64),
    torch.int16: (torch.int32, torch.int64),
    torch.int32: (torch.int64,),
}
for _name, _wider in (("uint16", (torch.int32, torch.int64)), ("uint32", (torch.int64,))):
    if hasattr(torch, _name):
        _WIDER[getattr(torch, _name)] = _wider
_UINT64 = getattr(torch, "uint64", None)
_PACKED = {getattr(torch, n) for n in ("float4_e2m1fn_x2",) if hasattr(torch, n)}  # only moved as bytes
_REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
_SIGN_BIT = -(2**63)
# Bitwise ops see only the bits: bool as bytes, unsigned types as the signed type of their width.
_SAME_BITS = {torch.bool: torch.uint8}
for _name, _signed in (("uint16", torch.int16), ("uint32", torch.int32), ("uint64", torch.int64)):
    if hasattr(torch, _name):
        _SAME_BITS[getattr(torch, _name)] = _signed


def dtype_code(dtype: torch.dtype) -> int:
    """A small integer naming ``dtype`` identically on every rank (-1 for dtypes not listed)."""
    return _CODES.get(dtype, -1)


def dtype_from_code(code: int) -> torch.dtype:
    """Inverse of :func:`dtype_code`."""
    return DTYPES[code]


def is_integer(dtype: torch.dtype) -> bool:
    """True for signed and unsigned integer dtypes (not bool)."""
    return dtype in _SIGNED or dtype in _UNSIGNED


@dataclass(frozen=True)
class ReducePlan:
    """The steps that turn a reduction request into one library op on a wire tensor.

    Encoding applies, in order: ``view_real`` (complex -> trailing dim of 2 reals),
    ``view_as`` (bit reinterpretation), ``flip_sign`` (xor the int64 sign bit), ``cast_to``.
    """

    op: ReduceOp  # the library op: SUM, MIN, MAX, PRODUCT or a bitwise one
    average: bool = False  # divide by the number of ranks after the reduction
    view_real: bool = False
    view_as: torch.dtype | None = None
    flip_sign: bool = False
    cast_to: torch.dtype | None = None
    gather: bool = False  # no library op fits: gather every rank's tensor and reduce locally

    @property
    def identity(self) -> bool:
        """True when the tensor goes to the library as it is (apart from AVERAGE's division)."""
        return not (self.view_real or self.view_as or self.flip_sign or self.cast_to or self.gather)


def _refuse(dtype: torch.dtype, op: ReduceOp, why: str, hint: str) -> ValueError:
    return ValueError(with_hint(f"cannot reduce a {dtype} tensor with {op.name}: {why}", hint))


def plan_reduction(
    dtype: torch.dtype, op: ReduceOp, native: Callable[[torch.dtype, ReduceOp], bool]
) -> ReducePlan:
    """Choose how to reduce ``dtype`` with ``op`` given what the library does natively.

    Raises:
        ValueError: the pair has no meaning (bool AVERAGE, complex MIN/MAX, uint64 AVERAGE)
            or the dtype cannot be reduced at all (e.g. quantized types).
        BackendError: ``op`` is ADASUM, which no accord backend implements.
    """
    op = ReduceOp(op)
    if op == ReduceOp.ADASUM:
        raise BackendError(with_hint(
            f"Adasum is not implemented by accord's backends (tensor dtype {dtype})",
            "use op=Average (or Sum) instead"))
    if op in BITWISE_OPS:
        return _plan_bitwise(dtype, op, native)
    average = op == ReduceOp.AVERAGE
    base = ReduceOp.SUM if average else op
    if dtype in _PACKED:
        raise _refuse(dtype, op, "it packs two 4-bit floats per byte and torch has no arithmetic for it",
                      "move it with broadcast/allgather/alltoall/scatter, or unpack it to a float type to reduce")
    if dtype == torch.bool:
        if average:
            raise _refuse(dtype, op, "the mean of booleans is not a boolean",
                          "use Sum (logical or) or Min (logical and), or cast to a number first")
        logical = ReduceOp.MAX if base in (ReduceOp.SUM, ReduceOp.MAX) else ReduceOp.MIN
        return ReducePlan(logical, view_as=torch.uint8)
    if dtype.is_complex:
        if base in (ReduceOp.MIN, ReduceOp.MAX):
            raise _refuse(dtype, op, "complex numbers are not ordered",
                          "reduce the real part, imaginary part or magnitude instead")
        if native(dtype, base):
            return ReducePlan(base, average)
        if base == ReduceOp.PRODUCT:
            return ReducePlan(base, gather=True)
        real = _REAL_OF[dtype]
        cast = None if native(real, ReduceOp.SUM) else torch.float32
        return ReducePlan(ReduceOp.SUM, average, view_real=True, cast_to=cast)
    if dtype.is_floating_point:
        if native(dtype, base):
            return ReducePlan(base, average)
        for wider in (torch.float32, torch.float64):
            if torch.finfo(wider).bits > torch.finfo(dtype).bits and native(wider, base):
                return ReducePlan(base, average, cast_to=wider)
        raise _refuse(dtype, op, "the backend reduces neither it nor a wider float type",
                      "cast the tensor to float32 or use another backend")
    if is_integer(dtype):
        return _plan_integer(dtype, op, base, average, native)
    raise _refuse(dtype, op, "the dtype is not a number type accord can reduce",
                  "convert the tensor to a plain integer or floating type first")


def _plan_bitwise(dtype: torch.dtype, op: ReduceOp, native: Callable[[torch.dtype, ReduceOp], bool]) -> ReducePlan:
    if dtype != torch.bool and not is_integer(dtype):
        raise _refuse(dtype, op, "bitwise reductions take integers or bool",
                      "use SUM/MIN/MAX/PRODUCT for floating tensors, or reduce an integer view")
    view = _SAME_BITS.get(dtype)
    if native(view or dtype, op):
        return ReducePlan(op, view_as=view)
    return ReducePlan(op, gather=True)


def fold(stacked: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Reduce a stack of every rank's tensors (dim 0, rank order) with ``op`` locally: what a plan
    with ``gather`` does after the gather."""
    return _FOLDS[ReduceOp(op)](stacked)


def _fold_pairwise(stacked: torch.Tensor, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
    out = stacked[0].clone()
    for row in stacked[1:]:
        fn(out, row, out=out)
    return out


def _plan_integer(dtype, op, base, average, native) -> ReducePlan:
    if average:
        if dtype == _UINT64:
            raise _refuse(dtype, op, "the sum may not fit in 64 bits",
                          "average in float64, or in int64 if your values are below 2**63")
        if dtype == torch.int64 and native(torch.int64, ReduceOp.SUM):
            return ReducePlan(ReduceOp.SUM, True)
        if native(torch.int64, ReduceOp.SUM):
            return ReducePlan(ReduceOp.SUM, True, cast_to=torch.int64)
    elif native(dtype, base):
        return ReducePlan(base)
    elif dtype == _UINT64 and native(torch.int64, base):
        flip = base in (ReduceOp.MIN, ReduceOp.MAX)
        return ReducePlan(base, view_as=torch.int64, flip_sign=flip)
    else:
        for wider in _WIDER.get(dtype, ()):
            if native(wider, base):
                return ReducePlan(base, cast_to=wider)
    raise _refuse(dtype, op, "the backend reduces neither it nor a wider integer type",
                  "cast the tensor to int64 or use another backend")


def encode(tensor: torch.Tensor, plan: ReducePlan) -> torch.Tensor:
    """The wire tensor for a contiguous ``tensor`` (a view when no cast or flip is needed)."""
    wire = tensor
    if plan.view_real:
        wire = torch.view_as_real(wire)
    if plan.view_as is not None:
        wire = wire.view(plan.view_as)
    if plan.flip_sign:
        wire = wire ^ _SIGN_BIT  # a new tensor: the caller's data stays intact
    if plan.cast_to is not None:
        wire = wire.to(plan.cast_to)
    return wire


def encode_view(tensor: torch.Tensor, plan: ReducePlan) -> torch.Tensor | None:
    """``tensor`` seen as the wire dtype of ``plan`` (a view: a result written there is the
    caller's once decoded), or None when the wire is a converted copy (a cast or a sign flip)."""
    if plan.flip_sign or plan.cast_to is not None:
        return None
    return encode(tensor, plan)


def decode(wire: torch.Tensor, plan: ReducePlan, dtype: torch.dtype) -> torch.Tensor:
    """Undo :func:`encode` on a reduced wire tensor; returns a tensor of ``dtype`` (maybe a view)."""
    out = wire
    if plan.cast_to is not None:
        # Casting back wraps integers like the native type would and rounds floats once.
        out = out.to(_pre_cast_dtype(plan, dtype))
    if plan.flip_sign:
        out = out ^ _SIGN_BIT
    if plan.view_as is not None:
        out = out.view(dtype)
    if plan.view_real:
        out = torch.view_as_complex(out)
    return out


def _pre_cast_dtype(plan: ReducePlan, dtype: torch.dtype) -> torch.dtype:
    if plan.view_as is not None:
        return plan.view_as
    if plan.view_real:
        return _REAL_OF[dtype]
    return dtype


def divide_(wire: torch.Tensor, count: int) -> None:
    """AVERAGE's final step on a reduced wire tensor: exact for floats, truncating for integers."""
    if count == 1:
        return
    if wire.is_floating_point() or wire.is_complex():
        wire.div_(count)
    else:
        wire.div_(count, rounding_mode="trunc")


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply in place by a prescale/postscale factor with Horovod's semantics.

    Floating and complex tensors are multiplied directly. Integer tensors are scaled in float64
    and truncated toward zero (Horovod casts ``factor * value`` back to the integer type).

    Raises:
        ValueError: ``tensor`` is bool and ``factor`` is not 1.
    """
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    elif tensor.dtype == torch.bool:
        raise ValueError(with_hint(f"cannot scale a bool tensor by {factor}",
                                   "leave prescale/postscale at 1 for bool tensors"))
    else:
        tensor.copy_(tensor.to(torch.float64).mul_(factor).trunc_())
