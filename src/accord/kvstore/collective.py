"""``dist_sync`` / ``dist_device_sync`` without parameter servers: every worker holds a replica.

Chosen by :func:`accord.kvstore.create` when no servers were launched. Each worker keeps every
key's value and applies the optimizer itself; the pushes of a round are combined through
accord's engine (the same one ``accord.torch`` uses), so every replica sees the same merged
value and stays identical:

- ``init``: rank 0's value is broadcast to every worker (which also makes everyone wait);
- ``push``: a worker merges its device values, then the workers allreduce (sum, max, min, or
  the average for ``param_only`` keys); with 2-bit compression each worker quantizes its merged
  value with its residual, the packed words are allgathered, and every worker dequantizes and
  sums them in rank order, which is what the servers compute from compressed pushes;
- the optimizer then runs on every worker with the same inputs.

The values equal those of ``dist_sync`` with servers (up to the order of floating-point
additions). Optimizer states live in each worker; ``save_optimizer_states`` writes this worker's
copy (identical on every worker) in the same file format as the servers' gather.

The engine session is started on first use (``accord.engine.init()``, a no-op when
``accord.torch.init()`` already ran) and left running by ``close()``.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch

from accord import engine
from accord.comm.ops import ReduceOp
from accord.kvstore.base import Key
from accord.kvstore.local import LocalKVStore
from accord.kvstore.sharding import wire_key
from accord.kvstore.values import KeyInfo, to_tensor

__all__ = ["CollectiveKVStore"]

_OPS = {"sum": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN}
_stores = itertools.count()  # the n-th store of this process; every worker creates them in order


class CollectiveKVStore(LocalKVStore):
    """Engine-backed ``dist_sync`` (see the module docstring)."""

    _compress_devices = False  # in dist types only worker-to-worker traffic is compressed

    def __init__(self, name: str = "dist_sync") -> None:
        super().__init__(name)
        engine.init()
        self._topology = engine.topology()
        self._prefix = f"accord.kvstore.{next(_stores)}"
        self._barriers = 0

    @property
    def rank(self) -> int:
        return self._topology.rank

    @property
    def num_workers(self) -> int:
        return self._topology.size

    @property
    def local_rank(self) -> int:
        return self._topology.local_rank

    def _name(self, what: str, key: Key) -> str:
        return f"{self._prefix}.{what}.{wire_key(key)}"

    def _initial_values(self, items: Sequence[tuple[Key, Any, KeyInfo]]) -> list[torch.Tensor]:
        tensors = [to_tensor(v).to(self._home(info), copy=True).contiguous() for _, v, info in items]
        handles = [engine.submit("broadcast", t, self._name("init", k), in_place=True, root_rank=0)
                   for (k, _, _), t in zip(items, tensors)]
        for handle in handles:
            engine.synchronize(handle)
        return tensors

    def _across_workers(self, merged: dict[Key, torch.Tensor], op: str) -> dict[Key, torch.Tensor]:
        comp = self._compression
        pending = []
        for k, value in merged.items():
            info = self._keys[k]
            if comp is not None and op == "sum" and not info.param_only and value.is_floating_point():
                packed = comp.compress(k, value)
                pending.append((k, True, engine.submit("allgather", packed, self._name("push", k))))
            else:
                value = value.contiguous()
                merged[k] = value
                reduce_op = ReduceOp.AVERAGE if info.param_only and op == "sum" else _OPS[op]
                pending.append((k, False, engine.submit("allreduce", value, self._name("push", k),
                                                        in_place=True, reduce_op=reduce_op)))
        for k, compressed, handle in pending:
            result = engine.synchronize(handle)
            if compressed:
                assert comp is not None
                shape = self._keys[k].shape
                total = None
                for chunk in result.chunk(self.num_workers):  # rank order, as documented
                    part = comp.decompress(chunk, shape).to(merged[k].dtype)
                    total = part if total is None else total.add_(part)
                merged[k] = total
        return merged

    def barrier(self) -> None:
        """Wait for every worker (an engine barrier)."""
        self._barriers += 1
        engine.synchronize(engine.submit("barrier", None, f"{self._prefix}.barrier.{self._barriers}"))

    _barrier = barrier
