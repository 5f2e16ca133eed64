"""The accord job's ranks as a Lightning ``ClusterEnvironment``, for accord's strategies.

accordrun (or mpirun, torchrun, SLURM: whatever started the job) creates the processes and
``hvd.init()`` finds the others, so Lightning starts nothing and sets no rank: every answer comes
from accord. Lightning's default environment would also remove ``WORLD_SIZE`` from the
environment at teardown; this one leaves the job's environment alone.
"""
from __future__ import annotations

import accord.torch as hvd
from accord.errors import with_hint


class EnvironmentMixin:
    """The methods of ``AccordEnvironment`` (the ``ClusterEnvironment`` of accord's strategies)."""

    @property
    def creates_processes_externally(self) -> bool:
        """Always True: the launcher started every rank."""
        return True

    @property
    def main_address(self) -> str:
        """Not used: accord's ranks meet through the job's own store, not a torch.distributed address."""
        raise NotImplementedError(_no_address("main_address"))

    @property
    def main_port(self) -> int:
        """Not used (see ``main_address``)."""
        raise NotImplementedError(_no_address("main_port"))

    @staticmethod
    def detect() -> bool:
        """True once ``hvd.init()`` has run in this process."""
        return hvd.is_initialized()

    def world_size(self) -> int:
        """The number of ranks of the job."""
        return hvd.size()

    def set_world_size(self, size: int) -> None:
        """Ignored: the launcher decided the world size."""

    def global_rank(self) -> int:
        """This process's rank in the job."""
        return hvd.rank()

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the launcher decided the ranks."""

    def local_rank(self) -> int:
        """This process's rank on its host."""
        return hvd.local_rank()

    def node_rank(self) -> int:
        """The index of this process's host (Horovod's ``cross_rank``)."""
        return hvd.cross_rank()

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Nothing to check: ``devices`` and ``num_nodes`` do not decide an accord job's size."""

    def teardown(self) -> None:
        """Nothing to undo."""


def _no_address(what: str) -> str:
    return with_hint(f"AccordEnvironment has no {what}: accord's ranks meet through the job's store",
                     "use accord's strategies (strategy='accord') with this environment; a strategy that needs "
                     "an address (DDP) takes torch.distributed's from MASTER_ADDR/MASTER_PORT, which accordrun sets")
