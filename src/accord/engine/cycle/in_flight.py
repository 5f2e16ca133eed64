"""The requests one process set's controller has in flight on this rank, by name.

A name is in flight from its submission until its handle completes. A second request under a
name in flight is refused at once on the rank that submits it (the caller reused a name before
synchronizing the first), as is a group of another size under a group key in flight (see
:class:`~accord.engine.naming.GroupsInFlight`). The controller releases names before it
completes their handles, so a caller that waited may reuse a name at once.

Every method runs under the controller's lock (the caller holds it).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from accord.engine.naming import GroupsInFlight
from accord.engine.request import Request
from accord.errors import InvalidArgumentError, with_hint


class InFlight:
    """Submitted and not yet completed requests, by name, and the group keys among them."""

    def __init__(self) -> None:
        self._requests: dict[str, Request] = {}
        self._groups = GroupsInFlight()  # one size per key

    def __contains__(self, name: str) -> bool:
        return name in self._requests

    def names(self) -> list[str]:
        """The names in flight, in submission order."""
        return list(self._requests)

    def requests(self) -> list[Request]:
        """The requests in flight, in submission order."""
        return list(self._requests.values())

    def add(self, requests: Sequence[Request], rank: int) -> None:
        """Record ``requests`` all or none (``rank``: this rank, for the error).

        Raises:
            InvalidArgumentError: a name is already in flight on this rank, or a group of
                another size under the same name.
        """
        for request in requests:
            if request.name in self._requests:
                raise InvalidArgumentError(with_hint(
                    f"a {self._requests[request.name].op.value} named {request.name!r} is already in "
                    f"flight on rank {rank}",
                    "synchronize the first handle before reusing the name, or use distinct names"))
            group = request.group
            if group is not None or self._groups:  # (submitting gradients one by one costs nothing more)
                self._groups.check(request.name, group, group is not None and group[0] in self._requests,
                                   request.op.value, rank)
        self._groups.add([r.group for r in requests])
        for request in requests:
            self._requests[request.name] = request

    def release(self, requests: Iterable[Request]) -> None:
        """Forget ``requests`` (completing now); a joined rank's stand-ins were never recorded."""
        for r in requests:
            if self._requests.get(r.name) is r:
                del self._requests[r.name]
                if r.group is not None:
                    self._groups.release(r.group)
