"""bootstrap() in one process: secrets, interfaces, check-in, re-bootstrap, clear failures."""
from __future__ import annotations

import os

import pytest

from accord import config
from accord.errors import ConfigError, RendezvousError
from accord.network_interfaces import address_or_interface, interface_address
from accord.runtime import environments as envs
from accord.runtime.bootstrap import active_runtime, bootstrap, load_secret
from accord.store.connection import StoreConnection
from accord.store.server import StoreServer
from accord.worker_contract import CHECKIN_KEY

pytestmark = pytest.mark.timeout(30)

_LAUNCHER_PREFIXES = ("ACCORD_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_", "DMLC_")
_LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                   "MASTER_PORT", "GLOO_SOCKET_IFNAME", "PS_VERBOSE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No launcher variables from the outside; monkeypatch restores everything afterwards."""
    for key in config.snapshot():
        if key.startswith(_LAUNCHER_PREFIXES) or key in _LAUNCHER_NAMES:
            monkeypatch.delenv(key)
    return monkeypatch


def _env(**values: str) -> envs.JobEnvironment:
    return envs.detect(values)


def test_secret_from_hex_and_from_a_private_file(tmp_path):
    assert load_secret(_env(ACCORD_JOB_SECRET="ab" * 32)) == bytes.fromhex("ab" * 32)
    assert load_secret(_env()) is None
    path = tmp_path / "secret"
    path.write_text("cd" * 32 + "\n")
    os.chmod(path, 0o600)
    assert load_secret(_env(ACCORD_SECRET_FILE=str(path))) == bytes.fromhex("cd" * 32)


def test_secret_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text("cd" * 32)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="0644") as info:
        load_secret(_env(ACCORD_SECRET_FILE=str(path)))
    assert f"HINT: run `chmod 600 {path}`" in str(info.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_secret(_env(ACCORD_SECRET_FILE=str(tmp_path / "missing")))


@pytest.mark.parametrize("text", ["zz" * 32, "abcd"])
def test_bad_hex_secret_is_refused(text):
    with pytest.raises(ConfigError, match="HINT:"):
        load_secret(_env(ACCORD_JOB_SECRET=text))


def test_interface_address():
    assert interface_address("lo") == "127.0.0.1"
    assert address_or_interface("lo") == "127.0.0.1"
    assert address_or_interface("10.1.2.3") == "10.1.2.3"
    with pytest.raises(ConfigError, match="lo") as info:
        interface_address("nosuchif0")
    assert "HINT:" in str(info.value)
    with pytest.raises(ConfigError, match="nosuchif0"):
        address_or_interface("nosuchif0")
    with pytest.raises(ConfigError, match="not found"):  # a name, never an address, for the launcher
        interface_address("10.1.2.3")


def test_single_process_bootstrap_twice():
    import torch.distributed as dist

    for _ in range(2):
        rt = bootstrap(timeout=5)
        assert active_runtime() is rt
        t = rt.topology
        assert (rt.source, t.rank, t.size, t.local_size, t.cross_size) == ("single", 0, 1, 1, 1)
        assert len(rt.secret) == 32
        # torch.distributed's default group is the program's: bootstrap leaves it alone
        assert not dist.is_initialized()
        rt.store.set("k", "v")
        assert rt.store.get("k") == b"v"
        with pytest.raises(RendezvousError, match="already bootstrapped"):
            bootstrap(timeout=5)
        rt.close()
        rt.close()
        assert active_runtime() is None and not dist.is_initialized()


def test_interface_sets_gloo_variable_for_the_runtime_only(clean_env):
    clean_env.setenv("ACCORD_INTERFACE", "lo")
    with bootstrap(timeout=5):
        assert config.snapshot().get("GLOO_SOCKET_IFNAME") == "lo"
    assert "GLOO_SOCKET_IFNAME" not in config.snapshot()


def test_existing_process_group_is_adopted_not_destroyed():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rt = bootstrap(timeout=5)
        rt.close()
        assert dist.is_initialized()  # the program's group is left alone
    finally:
        dist.destroy_process_group()


def test_accord_launcher_store_gets_a_check_in(clean_env):
    secret = os.urandom(32)
    with StoreServer(secret=secret) as server:
        clean_env.setenv("ACCORD_RANK", "0")
        clean_env.setenv("ACCORD_SIZE", "1")
        clean_env.setenv("ACCORD_STORE_ADDR", "127.0.0.1")
        clean_env.setenv("ACCORD_STORE_PORT", str(server.port))
        clean_env.setenv("ACCORD_JOB_SECRET", secret.hex())
        clean_env.setenv("ACCORD_HOSTNAME", "fakehost")
        with bootstrap(timeout=5) as rt:
            assert rt.source == "accord" and rt.topology.hostnames == ("fakehost",)
            assert rt.secret == secret
        with StoreConnection("127.0.0.1", server.port, secret, timeout=2) as conn:
            assert conn.get(CHECKIN_KEY.format(rank=0)) == b"fakehost"
        # The wrong secret: refused at connection, clearly.
        clean_env.setenv("ACCORD_JOB_SECRET", os.urandom(32).hex())
        with pytest.raises(RendezvousError, match="wrong secret"):
            bootstrap(timeout=2)
        assert active_runtime() is None


@pytest.mark.parametrize(
    "environ, text",
    [
        ({"ACCORD_RANK": "0", "ACCORD_SIZE": "2", "ACCORD_STORE_ADDR": "127.0.0.1",
          "ACCORD_STORE_PORT": "1"}, "no job secret"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
          "MASTER_PORT": "1"}, "ACCORD_JOB_SECRET"),
        # no MASTER_PORT: the step's own port; the HINT says how to give srun's tasks a secret
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7",
          "SLURM_STEP_ID": "1"}, r"(?s)under srun .* at n1:20071 .*HINT: export ACCORD_JOB_SECRET=.* before srun"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
    ],
)
def test_missing_secret_or_address_fails_clearly(clean_env, environ, text):
    for key, value in environ.items():
        clean_env.setenv(key, value)
    with pytest.raises(RendezvousError, match=text) as info:
        bootstrap(timeout=1)
    assert "HINT:" in str(info.value)


def test_a_taken_store_port_under_slurm_says_to_set_master_port(clean_env):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for key, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
                           "MASTER_PORT": str(port), "ACCORD_JOB_SECRET": "ab" * 32}.items():
            clean_env.setenv(key, value)
        with pytest.raises(RendezvousError, match=rf"(?s)rank 0 \(under slurm\) could not start the job's "
                                                  rf"store: .*127.0.0.1:{port}.*HINT: set MASTER_PORT"):
            bootstrap(timeout=1)
