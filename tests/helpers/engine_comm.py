"""Test-only helpers for engine tests: communicators from accord's gloo backend, a call counter,
and an Engine wired the way the session wires it (without the rendezvous)."""
from __future__ import annotations

from helpers import groups


def make_comm(ranks):
    """A gloo communicator over ``ranks`` (collective on every rank; None on non-members).

    Its collective timeout is ACCORD_COLLECTIVE_TIMEOUT, read by the backend.
    """
    from accord.comm import get_backend

    return groups.create(get_backend("gloo"), list(ranks))


class CountingComm:
    """Wraps a communicator and counts calls per method (for 'one collective per cycle')."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.ranks, self.rank, self.size = inner.ranks, inner.rank, inner.size
        self.calls: dict[str, int] = {}

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


def start_engine(rank, size, extra_sets=(), count_negotiation=False, **overrides):
    """An Engine over gloo groups: set 0 = every rank, then ``extra_sets`` as ids 1, 2, ...

    Settings come from accord.config (so per-rank env works) with ``overrides`` on top.
    """
    from accord.engine.engine import Engine
    from accord.engine.sets import ProcessSetRegistry
    from accord.engine.settings import EngineSettings

    settings = EngineSettings.from_config(**overrides)
    registry = ProcessSetRegistry(size)
    registry.set_communicator(0, "cpu", make_comm(range(size)))
    for ranks in extra_sets:  # ids 1, 2, ... in this order
        registry.add(ranks, {"cpu": make_comm(ranks)})
    # A separate communicator for negotiation, so that counting its calls counts only those.
    negotiation = make_comm(range(size))
    if count_negotiation:
        negotiation = CountingComm(negotiation)
    engine = Engine(rank, size, negotiation, registry, settings)
    engine.start()
    return engine
