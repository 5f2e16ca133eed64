"""The KVStore's settings, typed: what ``create``, the parameter-server workers and the server
program read from the environment (accord's names; MXNet's DMLC_* and PS_VERBOSE accepted).

Each record is built where its reader starts, never at import: a program may set the variables
before its first ``create`` (tests do), and a server reads its own when it starts. Torch-free,
as the server program is.
"""
from __future__ import annotations

from dataclasses import dataclass

from accord import config


def process_role() -> str:
    """ACCORD_ROLE (DMLC_ROLE), lower case: worker, server or scheduler."""
    return str(config.get("ACCORD_ROLE")).lower()


def verbosity() -> int:
    """ACCORD_VERBOSE (PS_VERBOSE): 0 quiet, 1 connections and registration, 2 every message.

    Raises:
        ConfigError: the variable is neither a level nor a boolean.
    """
    return int(config.get("ACCORD_VERBOSE"))


def server_count() -> int:
    """ACCORD_NUM_SERVERS (DMLC_NUM_SERVER): the parameter servers of the job (0: none).

    Raises:
        ConfigError: the variable is not an integer.
    """
    return int(config.get("ACCORD_NUM_SERVERS"))


@dataclass(frozen=True)
class StoreLocation:
    """Where servers register and workers find them: the job's authenticated store."""

    host: str | None  # ACCORD_PS_ROOT_URI (DMLC_PS_ROOT_URI), else ACCORD_STORE_ADDR
    port: int | None  # ACCORD_PS_ROOT_PORT (DMLC_PS_ROOT_PORT), else ACCORD_STORE_PORT
    scheduler_store: bool  # no ACCORD_STORE_ADDR: an MXNet-style scheduler serves it, not accordrun

    @classmethod
    def from_config(cls) -> "StoreLocation":
        """Read ACCORD_PS_ROOT_URI/PORT and ACCORD_STORE_ADDR/PORT.

        Raises:
            ConfigError: a port is not an integer.
        """
        store_addr = config.get("ACCORD_STORE_ADDR")
        return cls(host=config.get("ACCORD_PS_ROOT_URI") or store_addr,
                   port=config.get("ACCORD_PS_ROOT_PORT") or config.get("ACCORD_STORE_PORT"),
                   scheduler_store=store_addr is None)


@dataclass(frozen=True)
class NetworkSettings:
    """What a server or scheduler binds and advertises on a job that spans hosts."""

    interface: str | None  # ACCORD_INTERFACE (DMLC_INTERFACE): a name (eth0) or an address
    node_host: str | None  # ACCORD_NODE_HOST (DMLC_NODE_HOST): the address to advertise

    @classmethod
    def from_config(cls) -> "NetworkSettings":
        """Read ACCORD_INTERFACE and ACCORD_NODE_HOST."""
        return cls(interface=config.get("ACCORD_INTERFACE"), node_host=config.get("ACCORD_NODE_HOST"))


@dataclass(frozen=True)
class WorkerSettings:
    """A parameter-server worker's settings (:class:`accord.kvstore.client.DistKVStore`)."""

    rank: int | None  # ACCORD_RANK; None: MXNet-style, the store's counter assigns one
    num_workers: int  # ACCORD_NUM_WORKERS (DMLC_NUM_WORKER), else ACCORD_SIZE, else 1
    local_rank: int  # ACCORD_LOCAL_RANK, else 0
    start_timeout: float  # seconds to reach the store and for every server to register
    verbose: bool  # ACCORD_VERBOSE above 0: log connection events to stderr
    reply_timeout: float  # ACCORD_KVSTORE_TIMEOUT: seconds to wait for a server's answer
    payload_mac: bool  # ACCORD_KVSTORE_PAYLOAD_MAC: authenticate array bytes too
    bigarray_bound: int  # ACCORD_KVSTORE_BIGARRAY_BOUND: elements from which a key is split across servers
    chunk_elements: int  # ACCORD_KVSTORE_CHUNK_ELEMENTS (at least 1): the largest piece per message

    @classmethod
    def from_config(cls) -> "WorkerSettings":
        """Read the variables above (with their MXNet aliases).

        Raises:
            ConfigError: one of them is set to text its parser rejects.
        """
        return cls(rank=config.get("ACCORD_RANK"),
                   num_workers=int(config.get("ACCORD_NUM_WORKERS") or config.get("ACCORD_SIZE") or 1),
                   local_rank=int(config.get("ACCORD_LOCAL_RANK") or 0),
                   start_timeout=float(config.get("ACCORD_START_TIMEOUT")),
                   verbose=bool(config.get("ACCORD_VERBOSE")),
                   reply_timeout=float(config.get("ACCORD_KVSTORE_TIMEOUT")),
                   payload_mac=bool(config.get("ACCORD_KVSTORE_PAYLOAD_MAC")),
                   bigarray_bound=int(config.get("ACCORD_KVSTORE_BIGARRAY_BOUND")),
                   chunk_elements=max(1, int(config.get("ACCORD_KVSTORE_CHUNK_ELEMENTS"))))


@dataclass(frozen=True)
class ServerSettings:
    """One parameter server's settings (``python -m accord.kvstore.server``)."""

    num_workers: int | None  # ACCORD_NUM_WORKERS (DMLC_NUM_WORKER), else ACCORD_SIZE; None: neither
    start_timeout: float  # seconds to reach the store
    index: int | None  # ACCORD_SERVER_INDEX; None: the store's counter assigns one
    payload_mac: bool  # ACCORD_KVSTORE_PAYLOAD_MAC
    chunk_elements: int  # ACCORD_KVSTORE_CHUNK_ELEMENTS: sets the largest frame it accepts
    ipc: bool  # ACCORD_KVSTORE_IPC: also listen on a Unix socket for workers on this host
    ipc_dir: str | None  # ACCORD_KVSTORE_IPC_DIR: where that socket's private directory goes

    @classmethod
    def from_config(cls) -> "ServerSettings":
        """Read the variables above (with their MXNet aliases).

        Raises:
            ConfigError: one of them is set to text its parser rejects.
        """
        workers = config.get("ACCORD_NUM_WORKERS") or config.get("ACCORD_SIZE")
        return cls(num_workers=int(workers) if workers else None,
                   start_timeout=float(config.get("ACCORD_START_TIMEOUT")),
                   index=config.get("ACCORD_SERVER_INDEX"),
                   payload_mac=bool(config.get("ACCORD_KVSTORE_PAYLOAD_MAC")),
                   chunk_elements=int(config.get("ACCORD_KVSTORE_CHUNK_ELEMENTS")),
                   ipc=bool(config.get("ACCORD_KVSTORE_IPC")),
                   ipc_dir=config.get("ACCORD_KVSTORE_IPC_DIR"))
