"""accord.engine: the background engine that matches named collectives across ranks.

- :mod:`~accord.engine.session` — frontend-neutral API (init, shutdown, process sets, submit);
  ``accord.torch`` and ``accord.kvstore`` wrap it.
- :mod:`~accord.engine.engine` — routes each request to its process set's controller; handles.
- :mod:`~accord.engine.cycle.controller` — one process set's thread: queue, cycles, negotiation
  among the set's members only (sets progress independently).
- :mod:`~accord.engine.negotiation.negotiate` — which requests are ready / mismatched (pure logic).
- :mod:`~accord.engine.cycle.fusion`, :mod:`~accord.engine.cycle.execute` — packing and running collectives.
- :mod:`~accord.engine.negotiation.join` — Horovod's join: joined ranks serve the others' collectives.
- :mod:`~accord.engine.compression`, :mod:`~accord.engine.cycle.stall`, :mod:`~accord.engine.cycle.timeline`.

Importing this package imports nothing else (no torch), so it stays cheap.
"""
