"""accord as a torch.distributed backend: ``init_process_group("accord")`` puts DDP, FSDP,
DTensor, torch.distributed.checkpoint and every torch.distributed program on accord's engine.

    import accord.distributed          # or nothing at all on torch >= 2.5 (backend autoload)
    import torch.distributed as dist

    dist.init_process_group("accord")  # env://, tcp://, file:// or store=, as with "gloo"
    model = torch.nn.parallel.DistributedDataParallel(model)

The default group starts accord's engine on the store torch hands over (the job's authenticated
store under accordrun), or joins the one ``hvd.init()`` started: ``hvd.allreduce`` and
``dist.all_reduce`` work side by side in one process. ``new_group`` makes an accord process set
of its members. See docs/torch-distributed.md.
"""
from __future__ import annotations

from typing import Any

from accord.distributed.autoload import BACKEND_NAME, register

__all__ = ["BACKEND_NAME", "AccordProcessGroup", "register"]

PUBLIC_MODULES = ("autoload",)

register()


def __getattr__(name: str) -> Any:
    if name == "AccordProcessGroup":  # imports the engine: only when asked for
        from accord.distributed.process_group import AccordProcessGroup

        return AccordProcessGroup
    raise AttributeError(f"module 'accord.distributed' has no attribute {name!r}")
