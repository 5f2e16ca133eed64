"""Sharded optimizer state for ``hvd.DistributedOptimizer`` (ZeRO stage 1 and 2).

``layout`` (pure: buckets and per-rank spans), ``checks`` (what is refused, on every rank),
``state_dict`` (the consolidated form), ``checkpoint`` (the per-rank DTensor form that
``torch.distributed.checkpoint`` reshards), ``scaling`` (inf/nan agreement, global-norm
clipping, GradScaler) and ``optimizer`` (the hooks, the reductions, the step).
Reached through ``hvd.DistributedOptimizer(..., shard_optimizer_state=True)``.
"""
