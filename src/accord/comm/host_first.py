"""Negotiating across hosts in two short steps instead of one flat collective.

Every engine cycle starts with a small integer SUM allreduce (:mod:`accord.engine.negotiation.negotiate`).
On a job spanning hosts, a flat Gloo allreduce over every rank costs several network round
trips, about what the data collective of a small request costs: a lone synchronous allreduce
then pays roughly twice. When the global set's CPU communicator is hierarchical (it has a
host-local and a cross-host communicator, see :mod:`accord.comm.hierarchical`), the vector is
instead summed within each host (shared memory, microseconds) and then across hosts among the
ranks of equal local rank (every local rank in parallel, over a Gloo group with one rank per
host): every rank ends with the global sum after one cross-host exchange among few ranks.
The full exchange (an allgather of pending names, rare) stays on the flat communicator.
"""
from __future__ import annotations

from typing import Any

from accord.comm.backend import Communicator
from accord.comm.ops import ReduceOp


class HostFirstNegotiation:
    """The negotiation communicator's two collectives: allreduce host-first, allgather flat."""

    def __init__(self, flat: Communicator, local: Communicator, cross: Communicator) -> None:
        self.flat, self.local, self.cross = flat, local, cross
        self.ranks, self.rank, self.size = flat.ranks, flat.rank, flat.size

    def allreduce(self, tensor: Any, op: ReduceOp) -> None:
        """Sum within the host, then across hosts (``op`` must be SUM, MIN or MAX)."""
        self.local.allreduce(tensor, op)
        self.cross.allreduce(tensor, op)

    def allgather(self, tensor: Any) -> Any:
        """Every rank's tensor, concatenated in rank order (flat)."""
        return self.flat.allgather(tensor)


def host_first(negotiation: Communicator, data: Any) -> Communicator | HostFirstNegotiation:
    """``negotiation`` made host-first when ``data`` (the global set's CPU communicator) is a
    hierarchical one over the same ranks; otherwise ``negotiation`` itself."""
    local, cross = getattr(data, "local", None), getattr(data, "cross", None)
    if local is None or cross is None or tuple(data.ranks) != tuple(negotiation.ranks):
        return negotiation
    return HostFirstNegotiation(negotiation, local, cross)
