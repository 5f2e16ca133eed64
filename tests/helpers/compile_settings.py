"""The torch.compile setting fullgraph tests need on the older torch releases accord supports."""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch


def dynamic_output_shapes() -> ContextManager[object]:
    """Let Dynamo capture ops whose output size depends on data (accord's allgather, alltoall).

    From torch 2.9 ``fullgraph=True`` turns this on by itself (pytorch PR 163123); before, such an
    op in a fullgraph compile fails with "dynamic shape operator" unless
    ``torch._dynamo.config.capture_dynamic_output_shape_ops`` is set, as docs/from-horovod.md tells users.
    """
    if torch.__version__ >= "2.9":
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
