"""Reduction operations, with Horovod's integer values so ``hvd.Sum`` etc. compare equal."""
from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    """A reduction. Values match Horovod 0.28 (Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5);
    the bitwise ones (for integers and bool) are torch.distributed's, which Horovod lacks."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5
    BAND = 6
    BOR = 7
    BXOR = 8


BITWISE_OPS = frozenset({ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR})


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
