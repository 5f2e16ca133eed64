"""The backend registry and the device -> backend choice (no processes, no collectives)."""
import subprocess
import sys

import pytest

from accord import comm
from accord.comm import backend as registry
from accord.errors import BackendError


def test_builtin_backends_registered():
    assert {"gloo", "nccl", "mpi"} <= set(comm.known_backends())


def test_unknown_backend_lists_known_names():
    with pytest.raises(BackendError) as info:
        comm.get_backend("cncl-typo")
    text = str(info.value)
    assert "'cncl-typo'" in text
    for name in ("gloo", "mpi", "nccl"):
        assert name in text
    assert "\nHINT: " in text


def test_register_custom_backend():
    class Fake:
        name = "fake"
        device_types = frozenset({"cpu"})

        def create(self, ranks):
            return None

    comm.register_backend("fake-test", Fake)
    try:
        assert "fake-test" in comm.known_backends()
        assert isinstance(comm.get_backend("fake-test"), Fake)
    finally:
        registry._REGISTRY.pop("fake-test")


def test_backend_name_defaults(monkeypatch):
    for name in ("ACCORD_CPU_BACKEND", "ACCORD_GPU_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    assert comm.backend_name_for("cpu") == "gloo"  # auto, ranks on several hosts
    assert comm.backend_name_for("cpu", single_host=True) == "shm"  # auto, one host (Linux)
    assert comm.backend_name_for("cuda") == "nccl"
    assert comm.backend_name_for("cuda", single_host=True) == "nccl"


def test_backend_name_explicit_gloo_stays_on_one_host(monkeypatch):
    monkeypatch.setenv("ACCORD_CPU_BACKEND", "gloo")
    assert comm.backend_name_for("cpu", single_host=True) == "gloo"


def test_backend_name_honours_config(monkeypatch):
    monkeypatch.setenv("ACCORD_CPU_BACKEND", "mpi")
    monkeypatch.setenv("ACCORD_GPU_BACKEND", "my-vendor")
    assert comm.backend_name_for("cpu", single_host=True) == "mpi"
    assert comm.backend_name_for("cuda") == "my-vendor"


def test_backend_name_unknown_device():
    with pytest.raises(BackendError, match="'xpu'") as info:
        comm.backend_name_for("xpu")
    assert "HINT:" in str(info.value)


def test_backend_objects():
    gloo, nccl, mpi = (comm.get_backend(n) for n in ("gloo", "nccl", "mpi"))
    assert (gloo.name, gloo.device_types) == ("gloo", frozenset({"cpu"}))
    assert (nccl.name, nccl.device_types) == ("nccl", frozenset({"cuda"}))
    assert (mpi.name, mpi.device_types) == ("mpi", frozenset({"cpu"}))


def test_torch_backend_needs_default_group():
    with pytest.raises(BackendError, match="not initialized") as info:
        comm.get_backend("gloo").create([0])
    assert "HINT:" in str(info.value)


@pytest.mark.timeout(30)
def test_import_is_light():
    # `import accord.comm` imports neither torch nor mpi4py; the mpi backend object still
    # does not import mpi4py (only creating a communicator does).
    code = ("import sys, accord.comm as c; c.backend_name_for('cpu'); "
            "print('torch' in sys.modules, 'mpi4py' in sys.modules); "
            "c.get_backend('mpi'); print('mpi4py' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=25)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]


def test_a_backend_named_for_tensors_it_cannot_move_is_refused():
    from accord.comm.backend import get_backend
    from accord.engine.startup import check_devices as _check_devices
    from accord.errors import ConfigError

    _check_devices({"cpu": get_backend("gloo"), "cuda": get_backend("nccl")})  # the defaults pass
    with pytest.raises(ConfigError, match="(?s)ACCORD_CPU_BACKEND names backend 'nccl'.*HINT"):
        _check_devices({"cpu": get_backend("nccl")})
    with pytest.raises(ConfigError, match="ACCORD_GPU_BACKEND names backend 'shm'"):
        _check_devices({"cpu": get_backend("shm"), "cuda": get_backend("shm")})
