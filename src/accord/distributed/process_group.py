"""``AccordProcessGroup``: a ``torch.distributed.ProcessGroup`` whose collectives run on accord's engine.

Every collective goes through the engine's one door (:func:`accord.engine.submit_group`): the
negotiation (a call that differs between ranks, in shape, dtype, op or root, raises on every rank
of the group instead of hanging), fusion, planned cycles, shared memory on one host, the hierarchy
across hosts, NCCL for CUDA tensors. Each call is one engine request per tensor, named by its
place in the group's sequence of calls (:mod:`accord.distributed.naming`: the names recur while
the program repeats a step, which the engine's cache and planned cycles need, and ranks that make
their calls in another order are told so, whatever the op).

Ranks in torch's options (``rootRank``, ``send``'s ``dst``) are ranks within the group; the engine
takes global ones (``members``). Results the engine hands back as new tensors are copied into the
outputs torch passed (allgather, gather, scatter, reduce_scatter, alltoall). Point-to-point
(``send``, ``recv``, ``recv_anysource``) takes a direct path (:mod:`accord.distributed.p2p`): a
transfer between two ranks has nothing to negotiate among the others.

torch calls these methods by the names of the version in use (2.13: ``all_gather_single``,
``reduce_scatter_single``, ``all_to_all_single``; 2.4: ``_allgather_base``, ``_reduce_scatter_base``,
``alltoall_base``): both are defined.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from accord import engine
from accord.distributed import ops
from accord.distributed.naming import GroupNames, describe
from accord.distributed.p2p import PointToPoint
from accord.distributed.work import AccordWork
from accord.errors import ShutdownError, with_hint

BACKEND_NAME = "accord"


class AccordProcessGroup(dist.ProcessGroup):
    """The process group ``init_process_group("accord")`` and ``new_group`` create.

    Args:
        set_id: the engine's process set for these ranks (0: every rank).
        members: the group's global ranks, in group-rank order.
        rank: this process's rank within the group.
        timeout: how long a collective may take (``init_process_group(timeout=...)``).
        name: torch's name of the group.
        on_shutdown: called once when torch destroys the group.
    """

    def __init__(self, set_id: int, members: Sequence[int], rank: int, timeout: timedelta, name: str,
                 on_shutdown: Callable[["AccordProcessGroup"], None] | None = None) -> None:
        super().__init__(rank, len(members))
        self.set_id = set_id
        self.members = tuple(members)
        self._rank, self._size = rank, len(members)
        self._timeout = timeout
        self._name = name
        self._names = GroupNames(name)
        self._on_shutdown = on_shutdown
        self._closed = False
        self._p2p = PointToPoint(self.members, rank, timeout, f"c10d/{name}")

    # --- identity (torch reads some of these from C++, some from Python) -----------------------

    def getRank(self) -> int:  # noqa: N802 (torch's names)
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        return self._size

    def getBackendName(self) -> str:  # noqa: N802
        return BACKEND_NAME

    def _set_group_name(self, name: str) -> None:
        # torch names a group after creating it; the base implementation only names C++ backends
        self._name = name
        try:
            super()._set_group_name(name)
        except RuntimeError:
            pass

    @property
    def group_name(self) -> str:
        """torch's name of the group (functional collectives find the group by it)."""
        return self._name

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def __repr__(self) -> str:
        return f"AccordProcessGroup(name={self._name!r}, ranks={list(self.members)}, rank={self._rank})"

    # --- the engine's door ---------------------------------------------------------------------

    def _submit(self, op: str, tensors: Sequence[torch.Tensor | None], finish: Callable[[Any], list[torch.Tensor]],
                what: str, opts: Any = None, *, problems: Sequence[str] | None = None, **kwargs: Any) -> AccordWork:
        """Submit one request per tensor, as one group; ``finish(results)`` gives the future's value."""
        self._check_open(what)
        name = self._names.next(describe(op, tensors, **kwargs))
        earlier = self._names.previous_work(name)
        if earlier is not None and not earlier.is_completed():
            earlier.drive()  # its name comes again: the earlier request must be done here first
        waited = _caller_waits(opts)
        handles = engine.submit_group(op, list(tensors), name, process_set_id=self.set_id,
                                      grouped=len(tensors) > 1, problems=problems, waited=waited, **kwargs)
        work = AccordWork(handles, lambda: finish([h.result() for h in handles]), f"{what} on group {self._name!r}",
                          on_error=self._names.forget)
        self._names.submitted(name, work)
        if not waited:
            # Nobody may call wait(): DDP's reducer and functional collectives wait on the future
            # from C++, which the engine cannot see; its cycle starts now.
            engine.poll(handles[-1])
        return work

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ShutdownError(with_hint(f"{what} on process group {self._name!r} after it was destroyed",
                                          "create a new group (or call init_process_group again)"))
        if not engine.is_initialized():
            raise ShutdownError(with_hint(f"{what} on process group {self._name!r}: accord was shut down",
                                          "do not call hvd.shutdown() while torch.distributed still uses accord"))

    def _root(self, rank: int, what: str) -> tuple[int, str]:
        return ops.group_rank_to_global(self.members, rank, what)

    # --- reductions ----------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> AccordWork:
        """Reduce every rank's ``tensors`` in place (one engine request each, fused)."""
        op, scale, problem = ops.reduction((opts or dist.AllreduceOptions()).reduceOp)
        problem = problem or ops.refused(tensors, op)
        return self._submit("allreduce", tensors, lambda _: list(tensors), "allreduce", opts, in_place=True,
                            reduce_op=op, prescale_factor=scale, problems=[problem] * len(tensors))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> AccordWork:
        """Several allreduces as one group."""
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> AccordWork:
        """Reduce into the root's ``tensors[0]`` (the others' are left as they are)."""
        opts = opts or dist.ReduceOptions()
        op, scale, problem = ops.reduction(opts.reduceOp)
        root, bad_root = self._root(opts.rootRank, "root rank")
        problem = bad_root or problem or ops.refused(tensors, op)

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for t, r in zip(tensors, results):
                if r is not None:
                    t.copy_(r)
            return list(tensors)

        return self._submit("reduce", tensors, finish, "reduce", opts, reduce_op=op, prescale_factor=scale,
                            root_rank=root, problems=[problem] * len(tensors))

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> AccordWork:
        """Reduce every rank's ``input_lists[0]`` and give rank ``i`` the ``i``-th part."""
        op, scale, problem = ops.reduction((opts or dist.ReduceScatterOptions()).reduceOp)
        width = max((t.numel() for parts in input_lists for t in parts), default=0)
        wires, problems = [], []
        for out, parts in zip(outputs, input_lists):
            bad = "" if len(parts) == self._size else with_hint(
                f"reduce_scatter got {len(parts)} inputs for a group of {self._size}", "pass one input per rank")
            stack = torch.zeros((self._size, width), dtype=out.dtype, device=out.device)
            for i, part in enumerate(parts[:self._size]):
                stack[i, :part.numel()] = part.reshape(-1)
            wires.append(stack)
            problems.append(problem or bad or ops.refused([out], op))

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for out, r in zip(outputs, results):
                out.copy_(r.reshape(-1)[:out.numel()].view_as(out))
            return list(outputs)

        return self._submit("reducescatter", wires, finish, "reduce_scatter", opts, reduce_op=op,
                            prescale_factor=scale, problems=problems)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> AccordWork:  # noqa: A002
        """``reduce_scatter_tensor``: ``input`` holds every rank's part in rank order."""
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> AccordWork:
        """Several ``reduce_scatter_tensor`` calls as one group."""
        op, scale, problem = ops.reduction((opts or dist.ReduceScatterOptions()).reduceOp)
        problems = [problem or _size_problem("reduce_scatter_tensor", i.numel(), o.numel() * self._size)
                    or ops.refused([i], op) for o, i in zip(outputs, inputs)]
        wires = [i.reshape(self._size, -1) if p == "" else i.reshape(-1) for i, p in zip(inputs, problems)]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for out, r in zip(outputs, results):
                out.copy_(r.view_as(out))
            return list(outputs)

        return self._submit("reducescatter", wires, finish, "reduce_scatter_tensor", opts, reduce_op=op,
                            prescale_factor=scale, problems=problems)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # --- data movement -------------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> AccordWork:
        """Overwrite every rank's ``tensors`` with the root's."""
        root, problem = self._root((opts or dist.BroadcastOptions()).rootRank, "root rank")
        return self._submit("broadcast", tensors, lambda _: list(tensors), "broadcast", opts, in_place=True,
                            root_rank=root, problems=[problem] * len(tensors))

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> AccordWork:
        """Every rank's ``inputs[i]`` into every rank's ``output_lists[i]`` (one output per rank),
        in rank order."""
        return self._allgather(output_lists, inputs, "allgather", opts)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> AccordWork:
        """``all_gather_coalesced``: rank ``r``'s ``inputs`` into ``output_lists[r]``, in input
        order. torch's layout is one list per rank, where ``allgather``'s is one list per input."""
        per_input = [[outs[i] for outs in output_lists if i < len(outs)] for i in range(len(inputs))]
        return self._allgather(per_input, inputs, "all_gather_coalesced", opts)

    def _allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                   what: str, opts: Any) -> AccordWork:
        """List allgathers as one group: ``output_lists[i]`` takes every rank's ``inputs[i]``."""
        problems = ["" if len(outs) == self._size else with_hint(
            f"{what} got {len(outs)} outputs for a group of {self._size}", "pass one output per rank")
            for outs in output_lists]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for outs, r in zip(output_lists, results):
                _copy_parts(r, outs)
            return [t for outs in output_lists for t in outs]

        return self._submit("allgather", [t.reshape(-1) for t in inputs], finish, what, opts, problems=problems)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> AccordWork:  # noqa: A002
        """``all_gather_into_tensor``: every rank's ``input`` into ``output``, in rank order."""
        return self.allgather_into_tensor_coalesced([output], [input], opts)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> AccordWork:
        """Several ``all_gather_into_tensor`` calls as one group."""
        problems = [_size_problem("all_gather_into_tensor", o.numel(), i.numel() * self._size)
                    for o, i in zip(outputs, inputs)]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for out, r in zip(outputs, results):
                out.copy_(r.view_as(out))
            return list(outputs)

        return self._submit("allgather", [i.reshape(-1) for i in inputs], finish, "all_gather_into_tensor",
                            opts, problems=problems)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> AccordWork:
        """Every rank's ``inputs[0]`` into the root's ``output_lists[0]``."""
        root, problem = self._root((opts or dist.GatherOptions()).rootRank, "root rank")

        def finish(results: list[Any]) -> list[torch.Tensor]:
            if results[0] is None:
                return []
            _copy_parts(results[0], output_lists[0])
            return list(output_lists[0])

        return self._submit("gather", [inputs[0].reshape(-1)], finish, "gather", opts, root_rank=root,
                            problems=[problem])

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any = None) -> AccordWork:
        """The root's ``input_lists[0][i]`` into rank ``i``'s ``outputs[0]``."""
        root, problem = self._root((opts or dist.ScatterOptions()).rootRank, "root rank")
        out = outputs[0]
        splits = None
        if self._rank == (opts or dist.ScatterOptions()).rootRank and input_lists:
            parts = input_lists[0]
            if len(parts) != self._size:
                problem = problem or with_hint(f"scatter got {len(parts)} inputs for a group of {self._size}",
                                               "pass one input per rank")
            wire = torch.cat([p.reshape(-1) for p in parts]) if parts else out.new_empty(0)
            splits = [p.numel() for p in parts] if len(parts) == self._size else None
        else:
            wire = out.new_empty(0)

        def finish(results: list[Any]) -> list[torch.Tensor]:
            out.copy_(results[0].view_as(out))
            return [out]

        return self._submit("scatter", [wire], finish, "scatter", opts, root_rank=root, splits=splits,
                            problems=[problem])

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],  # noqa: A002
                      input_split_sizes: list[int], opts: Any = None) -> AccordWork:
        """``all_to_all_single``: rows of ``input`` to each rank (``input_split_sizes``, else equal
        parts), the rows from each rank into ``output``."""
        splits = list(input_split_sizes) if input_split_sizes else None

        def finish(results: list[Any]) -> list[torch.Tensor]:
            received, _ = results[0]
            output.copy_(received.view_as(output))
            return [output]

        return self._submit("alltoall", [input], finish, "all_to_all_single", opts, splits=splits)

    all_to_all_single = alltoall_base

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> AccordWork:
        """``all_to_all``: ``inputs[i]`` to rank ``i``, rank ``i``'s into ``outputs[i]``."""
        problem = "" if len(inputs) == len(outputs) == self._size else with_hint(
            f"all_to_all got {len(inputs)} inputs and {len(outputs)} outputs for a group of {self._size}",
            "pass one input and one output per rank")
        wire = torch.cat([t.reshape(-1) for t in inputs]) if inputs else torch.empty(0)
        splits = [t.numel() for t in inputs] if not problem else None

        def finish(results: list[Any]) -> list[torch.Tensor]:
            received, _ = results[0]
            _copy_parts(received, outputs)
            return list(outputs)

        return self._submit("alltoall", [wire], finish, "all_to_all", opts, splits=splits,
                            problems=[problem])

    def barrier(self, opts: Any = None) -> AccordWork:
        """Return once every rank of the group has entered."""
        return self._submit("barrier", [None], lambda _: [], "barrier", opts)

    # --- point to point ------------------------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        """Send ``tensors[0]`` to group rank ``dst`` (direct, see :mod:`accord.distributed.p2p`)."""
        self._check_open("send")
        return self._p2p.send(tensors[0], dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        """Receive into ``tensors[0]`` from group rank ``src``."""
        self._check_open("recv")
        return self._p2p.recv(tensors[0], src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        """Receive into ``tensors[0]`` from whichever rank sends first (``_source_rank()`` says which)."""
        self._check_open("recv")
        return self._p2p.recv_any(tensors[0], tag)

    # --- lifecycle -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """torch destroys the group: release what it holds (its engine set, its direct links)."""
        if self._closed:
            return
        self._closed = True
        self._p2p.close()
        if self._on_shutdown is not None:
            self._on_shutdown(self)

    def abort(self) -> None:
        """As :meth:`shutdown` (accord's groups have no in-flight state to abandon here)."""
        self.shutdown()


_THIS_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_TORCH_WRAPPERS = "distributed_c10d.py"


def _caller_waits(opts: Any) -> bool:
    """Whether the call came from one of torch's synchronous collectives (``async_op=False``),
    which call ``wait()`` at once: then the engine may wait for that, and the caller's thread runs
    the engine's planned cycle itself, as ``hvd.allreduce`` does (two thread hand-offs fewer for
    a small tensor). A torch whose options carry ``asyncOp`` says so there (True by default, so C++
    callers such as DDP's reducer are never taken for waiting ones); on one without, the first frame
    outside this package is torch's Python wrapper, if any, and its ``async_op`` says it."""
    async_op = getattr(opts, "asyncOp", None)
    if async_op is not None:
        return async_op is False
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_THIS_PACKAGE):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.endswith(_TORCH_WRAPPERS):
        return False
    return frame.f_locals.get("async_op") is False


def _size_problem(what: str, got: int, expected: int) -> str:
    if got == expected:
        return ""
    return with_hint(f"{what}: the output holds {got} elements where the group's inputs hold {expected}",
                     "make the output group-size times the input (in elements)")


def _copy_parts(flat: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    """Copy consecutive parts of ``flat`` into ``outs`` (each takes as many elements as it holds)."""
    at = 0
    for out in outs:
        n = out.numel()
        out.copy_(flat[at:at + n].view_as(out))
        at += n
