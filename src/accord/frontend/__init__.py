"""The framework-neutral half of every frontend (Horovod keeps it in ``horovod/common``): what
``accord.torch`` and ``accord.mxnet`` share above the engine, defined once here and re-exported
by both.

- :mod:`~accord.frontend.lifecycle` — ``init`` / ``shutdown`` (a frontend adds its own steps
  with ``add_hooks``);
- :mod:`~accord.frontend.queries` — ``size``, ``rank``, the local and cross coordinates,
  ``is_homogeneous``, ``is_initialized``, with Horovod's not-initialized error;
- :mod:`~accord.frontend.process_sets` — ``ProcessSet``, ``global_process_set``,
  ``add_process_set``, ``remove_process_set`` (every rank's ``init`` sets:
  :mod:`~accord.frontend.set_union`);
- :mod:`~accord.frontend.timeline_control` — ``start_timeline`` / ``stop_timeline``;
- :mod:`~accord.frontend.object_collectives` — what ``broadcast_object`` / ``allgather_object`` run;
- :mod:`~accord.frontend.batch_norm_scope` — SyncBatchNorm's ``comm_scope``;
- :mod:`~accord.frontend.build_flags`, :mod:`~accord.frontend.backend_flags` — Horovod's
  ``*_built()`` and ``*_enabled()``;
- :mod:`~accord.frontend.settings` — what this layer reads from :mod:`accord.config`.

Its modules use the engine through ``accord.engine``'s declared names only.
"""

# The modules other accord packages may import; the rest are this package's own
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES = ("backend_flags", "batch_norm_scope", "build_flags", "lifecycle", "object_collectives",
                  "process_sets", "queries", "timeline_control")
