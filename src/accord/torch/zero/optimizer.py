"""The sharded ``DistributedOptimizer`` (ZeRO stage 1, and stage 2 with ``shard_gradients``).

Each rank of the process set owns one balanced span of every bucket
(:mod:`accord.torch.zero.layout`) and keeps optimizer state for those elements only:

1. backward: a post-accumulate-grad hook per parameter puts its gradient into its bucket's flat
   buffer; when the last parameter of a bucket is in, the bucket's reducescatter starts, so the
   traffic overlaps the rest of backward (the bucket order is backward's order);
2. ``step()``: wait for the reducescatters; each rank's owned part of the averaged gradient is the
   ``.grad`` of its *shard* tensors (one flat tensor per bucket), which an optimizer of the user's
   class and hyper-parameters steps;
3. the updated shards are all-gathered, bucket by bucket, straight into every rank's parameters
   (each shard is its rank's span of its bucket's flat parameters: an in-place allgather).

Stage 1 keeps one flat gradient buffer per bucket and makes each ``p.grad`` a view of it (no
second copy of the gradients); the reducescatter writes this rank's reduced span back into it
(in place). Stage 2 (``shard_gradients=True``) copies a gradient into a bucket buffer that is
in use only until its reducescatter is done (then kept for a later pass:
:mod:`accord.torch.zero.pass_buffers`) and drops ``p.grad``: what stays is the owned shard of
the gradient, one kept tensor per bucket that the reducescatter writes into. So a step's
collectives write into tensors that live across steps instead of allocating their results
(except an accumulating pass's in stage 2). With ``backward_passes_per_step > 1`` stage 1 sums
the passes locally (autograd accumulates into the views) and reduces once, like the unsharded
optimizer; stage 2 reduces every pass and sums the owned shards (the same value, summed in
another order), because keeping the full local sum would keep the full gradient.

After ``step()`` the parameters are equal on every rank. ``p.grad`` holds this rank's own
(unreduced) gradient in stage 1 and nothing in stage 2: the averaged gradient exists only as
shards (see :meth:`_ShardedMixin.clip_grad_norm_` for clipping by the global norm).
"""
from __future__ import annotations

import inspect
import itertools
import warnings
from typing import Any, Callable

import torch

from accord.comm.ops import ReduceOp
from accord.errors import with_hint
from accord.torch import async_ops as A
from accord.torch import gateway
from accord.torch.grad_reduction import TOO_MANY_PASSES, ZERO_GRAD_RACE, _DistributedMixin, wrap_optimizer
from accord.torch.process_sets import ProcessSet
from accord.torch.zero import checkpoint as C
from accord.torch.zero import scaling as Z
from accord.torch.zero import state_dict as S
from accord.torch.zero.checks import check_optimizer, check_same_everywhere, signature
from accord.torch.zero.layout import Bucket, Layout, ParamInfo, plan_layout
from accord.torch.zero.pass_buffers import PassBuffers

# Sharded optimizers are numbered in creation order (the same on every rank): the number keeps
# the requests of two sharded optimizers in one process apart.
_instances = itertools.count()


class _ShardedMixin(_DistributedMixin):
    """Methods layered over the wrapped optimizer class (see ``DistributedOptimizer`` with
    ``shard_optimizer_state=True``); naming, ``skip_synchronize``, the scale factors and
    ``remove_hooks`` are the unsharded optimizer's."""

    shard_optimizer_state = True  # (what accord.hapi looks for: state_dict() is a collective)

    # --- construction -------------------------------------------------------------------------

    def _zero_setup(self, base: type, named: list[tuple[str, torch.Tensor]], compression: Any,
                    backward_passes_per_step: int, op: ReduceOp, gradient_predivide_factor: float,
                    process_set: ProcessSet, shard_gradients: bool, bucket_bytes: int) -> None:
        from accord.torch.functions import allgather_object

        if not process_set.included():
            raise ValueError(with_hint(
                f"rank {gateway.rank()} is not in the process set {process_set} it shards over",
                "build the sharded DistributedOptimizer only on the ranks of its process set"))
        names = {id(p): name for name, p in named}
        params = [p for group in self.param_groups for p in group["params"]]
        groups = [g for g, group in enumerate(self.param_groups) for _ in group["params"]]
        check_same_everywhere(signature([(names[id(p)], p) for p in params], groups),
                              lambda obj: allgather_object(obj, process_set=process_set))
        self._base = base
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.process_set = process_set
        self.shard_gradients = shard_gradients
        self._tag = f"zero{next(_instances)}"
        if shard_gradients:
            # A GradScaler then calls step() with what it set (see scaling.scaler_attributes)
            # instead of failing on the p.grad it cannot find.
            self._step_supports_amp_scaling = True
        # Only what requires grad is sharded; other parameters are never stepped by torch either.
        self._all_params = params
        self._names = [names[id(p)] for p in params]
        self._index = [i for i, p in enumerate(params) if p.requires_grad]  # layout -> optimizer
        self._params = [params[i] for i in self._index]
        self._infos = [ParamInfo(tuple(p.shape), p.dtype, groups[i]) for i, p in zip(self._index, self._params)]
        self._bucket_bytes = bucket_bytes
        self._partition()
        self._synchronized = False
        self._should_synchronize = True
        self._loaded: dict[str, Any] | None = None  # a full state dict loaded since the last step
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                              for i, p in enumerate(self._params)]

    def _partition(self) -> None:
        """Cut the shards for the set as it is now: layout, shards, the optimizer over them (no
        state yet), gradient buffers and the per-step bookkeeping."""
        self._world, self._me = self.process_set.size(), self.process_set.rank()
        self._mesh: Any = None  # (the DCP form's device mesh over these ranks, made at its first use)
        self._layout: Layout = plan_layout(self._infos, self._world, self._bucket_bytes)
        self._bucket_of = self._layout.bucket_of()
        self._slot_of = {s.param: s for b in self._layout.buckets for s in b.slots}
        self._pieces = [b.pieces(self._me) for b in self._layout.buckets]
        # Each bucket's parameters become views of one flat buffer (their values unchanged), and
        # a rank's shard is a view of its span of it: the optimizer steps the parameters' own
        # memory, so the shards cost nothing beside the parameters.
        self._param_buffers = [self._flatten(b) for b in self._layout.buckets]
        self._shards = [flat[start:end] for flat, (start, end) in
                        zip(self._param_buffers, (b.spans[self._me] for b in self._layout.buckets))]
        self._local = self._local_optimizer()
        # Stage 1: one persistent flat gradient per bucket, the parameters' .grad are its views.
        self._grad_buffers: list[torch.Tensor | None] = [
            None if self.shard_gradients else self._zeros(b, b.numel) for b in self._layout.buckets]
        self._views = {} if self.shard_gradients else {
            s.param: self._grad_buffers[b.index][s.offset:s.offset + s.numel].view(self._params[s.param].shape)
            for b in self._layout.buckets for s in b.slots}
        self._pass_buffers: list[torch.Tensor | None] = [None] * len(self._layout.buckets)
        self._reuse = PassBuffers()  # stage 2's pass buffers, kept once collected
        self._filled: list[set[int]] = [set() for _ in self._layout.buckets]
        self._launches = [0] * len(self._layout.buckets)
        self._handles: dict[int, Any] = {}  # bucket index -> reducescatter handle in flight
        self._grad_shards: list[torch.Tensor | None] = [None] * len(self._layout.buckets)
        # Stage 2: one owned gradient shard per bucket (made at its first reduction, then
        # kept), which each step's first reducescatter of the bucket writes into.
        self._owned_grads: list[torch.Tensor | None] = [None] * len(self._layout.buckets)
        self._delay = [self.backward_passes_per_step] * len(self._params)

    def _accord_reshard(self, state_dict: dict[str, Any]) -> None:
        """Re-partition for the set's current size (an elastic reset) and load ``state_dict``
        (the last committed full state), each rank keeping its new span; a collective only in
        that every rank of the new set must do it."""
        for p in self._params:
            p.grad = None  # (stage 1's were views of the old buffers)
        self._partition()
        self.load_state_dict(state_dict)

    def _zeros(self, bucket: Bucket, numel: int) -> torch.Tensor:
        device = self._params[bucket.slots[0].param].device
        return torch.zeros(numel, dtype=bucket.dtype, device=device)

    def _flatten(self, bucket: Bucket) -> torch.Tensor:
        flat = self._zeros(bucket, bucket.numel)
        with torch.no_grad():
            for slot in bucket.slots:
                p = self._params[slot.param]
                view = flat[slot.offset:slot.offset + slot.numel]
                view.copy_(p.detach().reshape(-1))
                p.data = view.view(p.shape)
        return flat

    def _local_optimizer(self) -> torch.optim.Optimizer:
        """An optimizer of the user's class over this rank's shards, one group per user group."""
        groups = []
        for g, group in enumerate(self.param_groups):
            options = {k: v for k, v in group.items() if k != "params"}
            shards = [self._shards[b.index] for b in self._layout.buckets if b.group == g]
            groups.append({**options, "params": shards})
        # The constructor gets the defaults it names (some defaults are derived, e.g. AdamW's
        # decoupled_weight_decay); every group carries the user's options anyway.
        accepted = inspect.signature(self._base.__init__).parameters
        defaults = {k: v for k, v in self.defaults.items() if k in accepted}
        try:
            return self._base(groups, **defaults)
        except (TypeError, ValueError) as exc:
            raise ValueError(with_hint(
                f"shard_optimizer_state=True could not build a {self._base.__name__} over the "
                f"shards ({exc})", "its constructor must accept (param_groups, **optimizer.defaults), "
                "as torch.optim's optimizers do; else use shard_optimizer_state=False")) from exc

    # --- backward: gradients into buckets, reducescatter -----------------------------------------

    def _make_hook(self, i: int) -> Callable[..., None]:
        def hook(*_ignored: Any) -> None:
            if self._delay[i] <= 0:
                raise AssertionError(TOO_MANY_PASSES)
            self._delay[i] -= 1
            if self.shard_gradients:
                self._stage2_hand_in(i)
            elif self._delay[i] == 0:
                self._stage1_hand_in(i)
        return hook

    def _stage1_hand_in(self, i: int) -> None:
        p, view = self._params[i], self._views[i]
        if p.grad is None:
            view.zero_()  # (another rank may have a gradient for p: send zeros, as unsharded)
            p.grad = view
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad.to_dense() if p.grad.is_sparse else p.grad)
            p.grad = view  # later passes and steps accumulate into the bucket itself
        bucket = self._bucket_of[i]
        self._filled[bucket.index].add(i)
        if len(self._filled[bucket.index]) == len(bucket.slots):
            self._launch(bucket)

    def _stage2_hand_in(self, i: int) -> None:
        p, bucket = self._params[i], self._bucket_of[i]
        if i in self._filled[bucket.index]:
            # Its bucket is still open from an earlier pass (another parameter had no gradient
            # then): send that pass's sum first; the missing gradients count as zeros.
            self._launch(bucket)
        buf = self._pass_buffers[bucket.index]
        if buf is None:
            buf = self._pass_buffers[bucket.index] = self._pass_buffer(bucket)
        slot = self._slot_of[i]
        if p.grad is not None:
            grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
            buf[slot.offset:slot.offset + slot.numel].copy_(grad.reshape(-1))
            p.grad = None  # what stays of this gradient is this rank's shard, after the reduction
        self._filled[bucket.index].add(i)
        if len(self._filled[bucket.index]) == len(bucket.slots):
            self._launch(bucket)

    def _launch(self, bucket: Bucket) -> None:
        b = bucket.index
        if b in self._handles:  # (stage 2: the same name may not be in flight twice)
            self._collect(b)
        # Collect the buckets already reduced (never waiting: a rank that blocked here could
        # wait for a bucket another rank submits later): in stage 2 their full-size buffers go
        # back to the spares at once, so only the buckets in flight hold them.
        for done in [k for k, h in self._handles.items() if gateway.poll(h)]:
            self._collect(done)
        start, end = bucket.spans[self._me]
        if self.shard_gradients:
            flat = self._pass_buffers[b]
            if flat is None:
                flat = self._pass_buffer(bucket)
            self._pass_buffers[b] = None
            self._reuse.lend(b, flat)
            # The step's first pass lands in the bucket's kept shard; a later pass (accumulating)
            # gets a result of its own, added to it when collected.
            out = None
            if self._grad_shards[b] is None:
                out = self._owned_grads[b]
                if out is None:
                    out = self._owned_grads[b] = self._zeros(bucket, end - start)
        else:
            flat = self._grad_buffers[b]
            # In place: this rank's span of the flat gradient receives the reduced span, under
            # the views that are the parameters' .grad, so that what walks p.grad (a
            # GradScaler's unscale_ and inf check) reaches exactly the gradients the shards
            # step with.
            out = flat[start:end]
        pre, post = self._scale_factors()
        self._handles[b] = A.reducescatter_tensors(
            [flat], f"{self._tag}.grad.{b}", self.op, self.process_set, pre, post, grouped=False,
            compression=self._compression, outputs=[out])
        self._filled[b] = set()
        self._launches[b] += 1

    def _pass_buffer(self, bucket: Bucket) -> torch.Tensor:
        """A zeroed flat buffer for one backward pass of ``bucket``'s gradients (stage 2)."""
        return self._reuse.take(bucket.numel, bucket.dtype, self._params[bucket.slots[0].param].device)

    def _collect(self, b: int) -> None:
        owned = gateway.synchronize(self._handles.pop(b))
        self._reuse.returned(b, owned)
        if not self.shard_gradients:
            self._grad_shards[b] = owned  # (this rank's span of the flat gradient)
        elif self._grad_shards[b] is None:
            self._grad_shards[b] = owned
        else:
            self._grad_shards[b].add_(owned)

    # --- synchronize and step ------------------------------------------------------------------

    def synchronize(self) -> None:
        """Finish every bucket's reducescatter (starting those whose hooks have not all fired;
        missing gradients count as zeros) and give the shards their averaged gradients."""
        for bucket in self._layout.buckets:
            b = bucket.index
            if self.shard_gradients:
                # Every rank reduces each bucket once per backward pass; a rank that saw fewer
                # gradients sends zeros, so that no peer waits for a reduction that never comes.
                if self._filled[b]:
                    self._launch(bucket)
                while self._launches[b] < self.backward_passes_per_step:
                    self._launch(bucket)
            elif self._launches[b] == 0:  # (a bucket may be collected already: launched is counted)
                for slot in bucket.slots:
                    if slot.param not in self._filled[b]:
                        self._stage1_hand_in(slot.param)
        for b in list(self._handles):
            self._collect(b)
        for b, shard in enumerate(self._shards):
            shard.grad = self._grad_shards[b]
        self._grad_shards = [None] * len(self._layout.buckets)
        if not self.shard_gradients:
            Z.agree_on_nonfinite([s.grad for s in self._shards], self._layout, self._me,
                                 [p.grad for p in self._params], self._allreduce)
        self._launches = [0] * len(self._layout.buckets)
        self._delay = [self.backward_passes_per_step] * len(self._params)
        self._synchronized = True

    def _allreduce(self, tensor: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        """A small tensor reduced over the set (the inf agreement, the global norm)."""
        return gateway.synchronize(A.allreduce_tensors([tensor], False, f"{self._tag}.{op.name.lower()}", op,
                                                       1.0, 1.0, self.process_set, grouped=False))

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Reduce-scatter the gradients (unless skipped), step this rank's shards with the
        wrapped optimizer's class, then all-gather the updated shards into the parameters.

        Returns:
            ``closure()``'s value, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        self._loaded = None
        self._sync_options()
        # (checked once the reductions are collected: a refused step leaves none in flight)
        scaling = Z.scaler_attributes(self, self.shard_gradients)
        for name, value in scaling.items():
            setattr(self._local, name, value)
        try:
            self._local.step()
        finally:
            for name in scaling:
                delattr(self._local, name)
        self._gather_parameters()
        return loss

    def _accord_local_step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Create this rank's shard state with a zero-gradient step, without communication
        (the parameters, whose memory the shards are, are put back as they were)."""
        saved = [shard.detach().clone() for shard in self._shards]
        for shard in self._shards:
            shard.grad = torch.zeros_like(shard)
        self._local.step()
        with torch.no_grad():
            for shard, value in zip(self._shards, saved):
                shard.grad = None
                shard.copy_(value)

    def _accord_broadcast_state(self, root_rank: int) -> None:
        """``broadcast_optimizer_state`` for a sharded optimizer (collective over its set).

        If root loaded a full state dict since its last step (the usual ``if rank == 0:
        opt.load_state_dict(checkpoint)``), that state goes to every rank, which keeps its part.
        Otherwise the state is already one sharded state (every rank steps the same buckets), and
        only root's options (lr, ...) are sent.
        """
        from accord.torch.functions import broadcast_object, broadcast_state_dict

        is_root = gateway.rank() == root_rank
        pending = self._loaded if is_root else None
        has_loaded = broadcast_object(pending is not None, root_rank, process_set=self.process_set)
        self._loaded = None
        if has_loaded:
            full = broadcast_state_dict(pending, root_rank, self._all_params, self.process_set)
            if not is_root:
                self.load_state_dict(full)
                self._loaded = None
            return
        options = broadcast_object([{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
                                   root_rank, process_set=self.process_set)
        for group, opts in zip(self.param_groups, options):
            group.update(opts)

    def _sync_options(self) -> None:
        # Schedulers and users change lr (and other options) in the user's groups.
        for mine, local in zip(self.param_groups, self._local.param_groups):
            for k, v in mine.items():
                if k != "params":
                    local[k] = v

    def _gather_parameters(self) -> None:
        """All-gather the updated spans into every bucket's flat parameters, in place (each
        shard is its rank's span of the flat parameters the gather writes): no gathered copy
        of a bucket is ever made, so every bucket can be in flight at once."""
        handles = [A.allgather_async(shard.detach(), name=f"{self._tag}.param.{b}",
                                     process_set=self.process_set, output=flat)
                   for b, (shard, flat) in enumerate(zip(self._shards, self._param_buffers))]
        for handle in handles:
            gateway.synchronize(handle)

    # --- the rest of the optimizer API ---------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the parameters' gradients and the shards'; refused while reductions are in
        flight (a race in Horovod too)."""
        if self._handles:
            raise AssertionError(ZERO_GRAD_RACE)
        self._base.zero_grad(self, set_to_none)
        for shard in self._shards:
            shard.grad = None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the shards are cut once, at construction.

        Raises:
            ValueError: always.
        """
        raise ValueError(with_hint("a sharded DistributedOptimizer cannot take new parameter groups",
                                   "add every group to the optimizer before wrapping it"))

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before gradients are reduced."""
        self.backward_passes_per_step = passes
        self._delay = [passes] * len(self._params)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradient by its norm over every shard of the set, as
        ``torch.nn.utils.clip_grad_norm_`` would clip the full averaged gradient.

        Call it after ``synchronize()`` and step inside ``skip_synchronize()``.

        Returns:
            The total norm (a 0-d float32 tensor, the same on every rank).
        Raises:
            RuntimeError: the gradients are not synchronized yet.
        """
        if not self._synchronized:
            raise RuntimeError(with_hint("clip_grad_norm_ needs the reduced gradient shards",
                                         "call optimizer.synchronize() first, then step inside "
                                         "optimizer.skip_synchronize()"))
        return Z.clip_by_global_norm([s.grad for s in self._shards], max_norm, norm_type, self._allreduce)

    def _gather(self, tensor: torch.Tensor, key: str) -> torch.Tensor:
        """Every rank's ``tensor``, concatenated in rank order (a collective over the set)."""
        return gateway.synchronize(A.allgather_async(tensor, name=f"{self._tag}.state.{key}",
                                                     process_set=self.process_set))

    def state_dict(self) -> dict[str, Any]:
        """The full optimizer state in ``torch.optim``'s form, on every rank (a collective: every
        rank of the set must call it). Loadable by the plain optimizer class and by a sharded
        optimizer at any world size."""
        return S.consolidate(self._local, self._shards, self._layout, self._index, self.param_groups,
                             self._gather)

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's part of the state in the form ``torch.distributed.checkpoint`` saves and
        reshards: keyed by parameter name, each per-element value a DTensor of its parameter's
        shape sharded by rows over every rank (see :mod:`accord.torch.zero.checkpoint`).

        A collective over every rank. Also the template that ``dcp.load`` fills in before
        :meth:`load_sharded_state_dict`; an optimizer without state yet first gets one from a
        step with zero gradients (the parameters are kept), as torch's
        ``get_optimizer_state_dict`` does.

        Returns:
            ``{"state": {name: {key: value}}, "param_groups": [{..., "params": [names]}]}``.
        Raises:
            BackendError: no ``torch.distributed`` default process group.
            ConfigError: the optimizer shards over a process set that is not every rank, or
                torch's ranks are not accord's.
        """
        if self._mesh is None:
            self._mesh = C.device_mesh(self.process_set, self._params[0].device.type if self._params else "cpu")
        if not self._local.state:
            self._accord_local_step()
        names = [self._names[i] for i in self._index]
        return C.to_sharded(S.each_state_value(self._local, self._shards, self._layout, self._gather),
                            self._layout, names, self._names, self.param_groups, self._mesh,
                            self._me, self._world)

    def load_sharded_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the form :meth:`sharded_state_dict` returns (as ``dcp.load`` filled it in, from a
        checkpoint saved at any world size): every rank keeps the part it owns. A collective
        over every rank.

        Raises:
            ConfigError: the state dict names other parameters or groups than this optimizer's,
                or a value's shape is not its parameter's.
        """
        loaded = C.check_names(state_dict, self._names, self.param_groups)
        names = [self._names[i] for i in self._index]
        entries = C.from_sharded(state_dict, self._layout, names, self._shards, self._me)
        for kept, group in zip(self.param_groups, loaded):
            kept.update({k: v for k, v in group.items() if k != "params"})
        self._local.load_state_dict(S.local_state_dict(entries, self._local, self._shards, loaded))
        self._handles, self._synchronized = {}, False
        self._delay = [self.backward_passes_per_step] * len(self._params)
        self._loaded = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full state (:meth:`state_dict`, or a plain ``torch.optim`` one for the same
        parameters): every rank keeps the part of it that it owns.

        Raises:
            ValueError: the state dict's groups do not match this optimizer's.
        """
        for kept, loaded in zip(self.param_groups, S.check_groups(state_dict, self.param_groups)):
            kept.update({k: v for k, v in loaded.items() if k != "params"})
        self._local.load_state_dict(S.shard_of(state_dict, self._local, self._shards, self._layout,
                                               self._me, self._index))
        self._handles, self._synchronized = {}, False
        self._delay = [self.backward_passes_per_step] * len(self._params)
        self._loaded = state_dict  # what broadcast_optimizer_state sends, if it comes next


def make_sharded_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Any, compression: Any,
                           backward_passes_per_step: int, op: ReduceOp, gradient_predivide_factor: float,
                           groups: Any, process_set: ProcessSet, shard_optimizer_state: bool,
                           shard_gradients: bool, bucket_cap_mb: float) -> torch.optim.Optimizer:
    """The sharded form of ``DistributedOptimizer`` (its arguments, already checked there).

    Raises:
        ValueError: what sharding does not support (every rank raises alike).
    """
    if not shard_optimizer_state:
        raise ValueError(with_hint("shard_gradients=True needs shard_optimizer_state=True",
                                   "pass shard_optimizer_state=True too (ZeRO stage 2 shards both)"))
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(with_hint(f"shard_optimizer_state=True supports op=Average and op=Sum, got {op.name}",
                                   "use op=hvd.Average (or hvd.Sum), or shard_optimizer_state=False"))
    if groups is not None:
        raise ValueError(with_hint("groups/num_groups do not apply to a sharded DistributedOptimizer",
                                   "leave groups unset; bucket_cap_mb sets how gradients are fused"))
    if not bucket_cap_mb > 0:
        raise ValueError(with_hint(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}",
                                   "pass the bucket size in MB, e.g. bucket_cap_mb=25"))
    check_optimizer(optimizer)
    base = type(optimizer)
    wrapped = wrap_optimizer(optimizer, _ShardedMixin)
    named = wrapped._accord_names(named_parameters)
    wrapped._zero_setup(base, named, compression, backward_passes_per_step, op,
                        gradient_predivide_factor, process_set, shard_gradients,
                        max(1, int(bucket_cap_mb * 2**20)))
    return wrapped
