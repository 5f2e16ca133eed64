"""The ``host`` backend: CUDA tensors moved through host memory by a CPU communicator.

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), and some CUDA builds of torch
have no NCCL at all. Rather than fail, accord can carry such a job's CUDA collectives over its
CPU backend (shared memory when every rank is on one host, Gloo otherwise): each collective
copies its input from the GPU into a host buffer, runs the CPU collective, and copies the
result back to the input's GPU. It costs a device-to-host and a host-to-device copy per
collective (PCIe or C2C speed) on top of the CPU backend's own cost, so it is a fallback for
correctness, not a fast path; :func:`accord.comm.devices.device_backends` picks it only when
NCCL cannot be used (see there), and ``ACCORD_GPU_BACKEND=host`` asks for it explicitly.

Ordering: the engine waits for each request's ready event before calling a communicator and
synchronizes its own stream before completing handles, so the copies here run on the engine
thread's current stream, after the producer and before any reader. The reused host buffer is
only refilled after the previous copy out of it has finished (the copies are synchronous).
"""
from __future__ import annotations

from typing import Sequence

import torch

from accord.comm.backend import Backend, Communicator
from accord.comm.base_communicator import check_writable
from accord.comm.groups import GroupContext
from accord.comm.ops import ReduceOp


class HostStagedCommunicator(Communicator):
    """A communicator for CUDA tensors that runs ``inner`` (a CPU communicator) on host copies.

    Tensors on the CPU are staged too (a plain copy), so the same code path is exercised
    wherever it runs.
    """

    backend_name = "host"

    def __init__(self, inner: Communicator) -> None:
        self.inner = inner
        self.ranks = inner.ranks
        self.rank = inner.rank
        self.size = inner.size
        self._stage = torch.empty(0, dtype=torch.uint8)

    # --- staging -------------------------------------------------------------------------

    def _host_buffer(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor shaped like ``t`` inside the reused (pinned, where CUDA is) buffer."""
        nbytes = t.numel() * t.element_size()
        # Pinned for CUDA tensors: page-locked memory copies at full speed, and only then.
        if self._stage.numel() < nbytes or (t.is_cuda and not self._stage.is_pinned()):
            self._stage = torch.empty(max(nbytes, 2 * self._stage.numel()), dtype=torch.uint8,
                                      pin_memory=t.is_cuda)
        return self._stage[:nbytes].view(t.dtype).view(t.shape)

    def _fresh(self, t: torch.Tensor) -> torch.Tensor:
        """A new host copy of ``t`` (for results that outlive this call)."""
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
        host.copy_(t)  # device-to-host copies without non_blocking return when the data is there
        return host

    def _staged(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` copied into the reused buffer, for an in-place collective."""
        check_writable(t)  # before any data moves, so every rank refuses alike
        host = self._host_buffer(t)
        host.copy_(t)
        return host

    @staticmethod
    def _device() -> torch.device:
        """Where results of ranks that passed no tensor go: the current CUDA device (the engine
        runs each CUDA work item under its tensors' device), or the CPU without CUDA."""
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _back(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``host`` (a result the inner communicator made) on ``device``, never aliasing the
        reused staging buffer (a result that is a view of it would be overwritten next time)."""
        if device.type != "cpu":
            return host.to(device)
        if host.numel() and self._stage.numel() and \
                host.untyped_storage().data_ptr() == self._stage.untyped_storage().data_ptr():
            return host.clone()
        return host

    @staticmethod
    def _copy_back(t: torch.Tensor, host: torch.Tensor) -> None:
        t.copy_(host)
        if t.is_cuda:  # the staging buffer is refilled by the next call: the copy must be done
            torch.cuda.current_stream(t.device).synchronize()

    # --- the Communicator protocol -------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` in place across ranks (through a host copy)."""
        host = self._staged(tensor)
        self.inner.allreduce(host, op)
        self._copy_back(tensor, host)

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """Overwrite ``tensor`` with root's, in place."""
        host = self._staged(tensor)
        self.inner.broadcast(host, root)
        self._copy_back(tensor, host)

    def reduce(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        """Reduce into root's ``tensor`` in place."""
        host = self._staged(tensor)
        self.inner.reduce(host, op, root)
        if self.rank == root:
            self._copy_back(tensor, host)

    def _host_output(self, out: torch.Tensor | None, tensor: torch.Tensor) -> torch.Tensor | None:
        """What the inner communicator writes for ``out``: ``out`` itself on the CPU, a fresh
        host tensor of its shape for a usable device output; anything else as it is, for the
        inner communicator to refuse (on every rank, where its check agrees across them)."""
        if not isinstance(out, torch.Tensor) or out.device.type == "cpu" or out.device != tensor.device \
                or out.layout is not torch.strided or not out.is_contiguous():
            return out
        return torch.empty(out.shape, dtype=out.dtype, pin_memory=True)

    def _into(self, out: torch.Tensor | None, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        if out is None:
            return self._back(host, device)
        if host is not out:
            self._copy_back(out, host)
        return out

    def allgather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's tensor concatenated along dim 0, on ``tensor``'s device (into ``out``
        when given, through a host copy)."""
        host_out = self._host_output(out, tensor)
        return self._into(out, self.inner.allgather(self._fresh(tensor), host_out), tensor.device)

    def gather(self, tensor: torch.Tensor, root: int) -> torch.Tensor | None:
        """Like allgather; only ``root`` gets the result."""
        out = self.inner.gather(self._fresh(tensor), root)
        return None if out is None else self._back(out, tensor.device)

    def scatter(self, chunks: Sequence[torch.Tensor] | None, root: int) -> torch.Tensor:
        """Root's ``chunks[i]`` to rank i (non-root ranks pass None)."""
        device = chunks[0].device if chunks else self._device()
        host = None if chunks is None else [self._fresh(c) for c in chunks]
        return self._back(self.inner.scatter(host, root), device)

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp, out: torch.Tensor | None = None) -> torch.Tensor:
        """Reduce, then this rank's rows of dim 0 (into ``out`` when given, through a host copy)."""
        host_out = self._host_output(out, tensor)
        return self._into(out, self.inner.reduce_scatter(self._fresh(tensor), op, host_out), tensor.device)

    def alltoall(self, tensor: torch.Tensor, splits: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``splits[i]`` to rank i; returns (received rows on ``tensor``'s device, CPU
        received splits)."""
        out, received = self.inner.alltoall(self._fresh(tensor), splits)
        return self._back(out, tensor.device), received

    def barrier(self) -> None:
        """Return once every rank has entered."""
        self.inner.barrier()

    def close(self) -> None:
        """Close the inner communicator (collective, where the inner one's close is)."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class HostStagedBackend(Backend):
    """A Backend for CUDA tensors whose communicators stage through ``inner``'s CPU ones."""

    device_types = frozenset({"cuda"})

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = "host"

    def create(self, context: GroupContext) -> HostStagedCommunicator:
        """Make ``inner``'s communicator over the members and wrap it (collective over the members)."""
        return HostStagedCommunicator(self.inner.create(context))
