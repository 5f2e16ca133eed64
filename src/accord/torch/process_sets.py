"""Horovod's process sets for accord.torch (``hvd.ProcessSet``, ``hvd.global_process_set``,
``hvd.add_process_set``, ``hvd.remove_process_set``): the shared ones of
:mod:`accord.frontend.process_sets`, here where accord.torch's modules and Horovod scripts
look for them."""
from __future__ import annotations

from accord.frontend.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set, set_id_of

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set", "set_id_of"]
