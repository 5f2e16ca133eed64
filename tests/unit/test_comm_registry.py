"""The backend registry and the device -> backend choice (no processes, no collectives)."""
import subprocess
import sys

import pytest

from accord import comm
from accord.comm import backend as registry
from accord.errors import BackendError, ConfigError


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


class Fake(comm.Backend):
    name = "fake"
    device_types = frozenset({"cpu"})

    def create(self, ranks):
        return None


@pytest.fixture
def saved_registry():
    saved = dict(registry._REGISTRY)
    yield registry._REGISTRY
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def test_register_custom_backend(saved_registry):
    comm.register_backend("fake-test", Fake)
    assert "fake-test" in comm.known_backends()
    assert isinstance(comm.get_backend("fake-test"), Fake)
    comm.register_backend("fake-test", Fake)  # the same factory again: nothing changes


def test_duplicate_backend_name_is_refused_unless_override(saved_registry):
    with pytest.raises(ConfigError, match=r"(?s)communication backend 'gloo' is already registered.*"
                                          r"HINT: .*override=True"):
        comm.register_backend("gloo", Fake)
    assert comm.get_backend("gloo").name == "gloo"  # untouched
    comm.register_backend("gloo", Fake, override=True)
    assert isinstance(comm.get_backend("gloo"), Fake)


def test_a_backend_missing_a_method_fails_when_it_is_built(saved_registry):
    class NoCreate(comm.Backend):
        name = "nocreate"
        device_types = frozenset({"cpu"})

    with pytest.raises(TypeError, match="create"):
        NoCreate()
    with pytest.raises(TypeError, match=r"(?s)NoCreate does not implement create.*HINT"):
        comm.register_backend("nocreate", NoCreate)
    # A factory function is only called when the backend is asked for: it fails there.
    comm.register_backend("nocreate", lambda: NoCreate())
    with pytest.raises(TypeError, match="create"):
        comm.get_backend("nocreate")


def test_a_factory_must_build_a_backend(saved_registry):
    class DuckTyped:  # has the methods, but is not an accord.comm.Backend
        name = "duck"
        device_types = frozenset({"cpu"})

        def create(self, ranks):
            return None

    class Nameless(comm.Backend):
        def create(self, ranks):
            return None

    comm.register_backend("duck", DuckTyped)
    comm.register_backend("nameless", Nameless)
    with pytest.raises(BackendError, match=r"(?s)DuckTyped, which is not a complete.*HINT: subclass"):
        comm.get_backend("duck")
    with pytest.raises(BackendError, match=r"missing: name, device_types"):
        comm.get_backend("nameless")


def test_a_communicator_missing_a_method_fails_when_it_is_built():
    from accord.comm.base_communicator import BaseCommunicator

    class NoBarrier(comm.Communicator):
        def allreduce(self, tensor, op): ...
        def broadcast(self, tensor, root): ...
        def allgather(self, tensor): ...
        def gather(self, tensor, root): ...
        def scatter(self, chunks, root): ...
        def reduce(self, tensor, op, root): ...
        def reduce_scatter(self, tensor, op): ...
        def alltoall(self, tensor, splits): ...

    with pytest.raises(TypeError, match="barrier"):
        NoBarrier()
    assert issubclass(BaseCommunicator, comm.Communicator)


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


def test_a_communicator_is_built_by_its_members_only():
    from accord.comm.groups import GroupContext

    with pytest.raises(ValueError, match="which it is not a member of") as info:
        GroupContext(None, "k", (0, 1), 2, ("h", "h", "h"), 5.0)
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
