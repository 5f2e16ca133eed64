"""Shared-memory collectives on one host: the backend, its communicator, the segment, the
synchronization between ranks and the reductions."""
