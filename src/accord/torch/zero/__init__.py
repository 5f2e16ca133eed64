"""Sharded optimizer state for ``hvd.DistributedOptimizer`` (ZeRO stage 1 and 2).

``layout`` (pure: buckets and per-rank spans), ``checks`` (what is refused, on every rank),
``state_dict`` (the consolidated form) and ``optimizer`` (the hooks, the reductions, the step).
Reached through ``hvd.DistributedOptimizer(..., shard_optimizer_state=True)``.
"""
