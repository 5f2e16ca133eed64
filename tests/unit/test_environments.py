"""Launcher detection from plain mappings: every launcher, precedence, SLURM lists, validation."""
from __future__ import annotations

import pytest

from accord.errors import ConfigError
from accord.runtime import environments as envs
from accord.runtime.environments import detect, expand_nodelist, expand_tasks_per_node

pytestmark = pytest.mark.timeout(10)

ACCORD = {"ACCORD_RANK": "3", "ACCORD_SIZE": "8", "ACCORD_LOCAL_RANK": "1", "ACCORD_LOCAL_SIZE": "2",
          "ACCORD_CROSS_RANK": "1", "ACCORD_CROSS_SIZE": "4", "ACCORD_HOSTNAME": "nodeB",
          "ACCORD_STORE_ADDR": "10.0.0.1", "ACCORD_STORE_PORT": "29400",
          "ACCORD_JOB_SECRET": "ab" * 32}
TORCHRUN = {"RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3",
            "GROUP_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}
OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
PMI = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
SLURM = {"SLURM_PROCID": "4", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
         "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_JOB_NODELIST": "gpu[01-03],cpu7",
         "SLURM_STEP_NODELIST": "gpu[01-03],cpu7"}


def test_nothing_set_is_a_single_process():
    env = detect({})
    assert (env.source, env.rank, env.size, env.local_rank, env.local_size) == ("single", 0, 1, 0, 1)
    assert env.rendezvous == envs.NO_STORE and env.single_host is True


def test_accord_contract():
    env = detect(ACCORD)
    assert (env.source, env.rank, env.size) == ("accord", 3, 8)
    assert (env.local_rank, env.local_size, env.cross_rank, env.cross_size) == (1, 2, 1, 4)
    assert (env.hostname, env.store_addr, env.store_port) == ("nodeB", "10.0.0.1", 29400)
    assert env.secret_hex == "ab" * 32 and env.rendezvous == envs.ACCORD_STORE
    assert env.single_host is False


def test_horovod_aliases_count_as_accord():
    env = detect({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
                  "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_HOSTNAME": "h"})
    assert (env.source, env.rank, env.size, env.local_rank, env.hostname) == ("accord", 1, 2, 1, "h")
    # Without a store address, rank 0 hosts one at MASTER_ADDR/PORT.
    assert env.rendezvous == envs.RANK0_STORE and env.single_host is True


def test_torchrun():
    env = detect(TORCHRUN)
    assert (env.source, env.rank, env.size, env.local_rank, env.local_size) == ("torchrun", 5, 6, 2, 3)
    assert (env.node_rank, env.store_addr, env.store_port) == (1, "m", 29500)
    assert env.restart_count == 2 and env.agent_store is True
    assert env.rendezvous == envs.TORCH_STORE
    plain = detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    assert plain.source == "torchrun" and plain.agent_store is False and plain.local_rank is None


def test_open_mpi():
    env = detect(OMPI)
    assert (env.source, env.rank, env.size, env.local_rank, env.local_size) == ("openmpi", 1, 4, 1, 2)
    assert env.is_mpi and env.rendezvous == envs.RANK0_STORE and env.single_host is False


def test_mpich_and_intel_mpi():
    env = detect(PMI)
    assert (env.source, env.rank, env.size, env.local_rank, env.local_size) == ("mpich", 2, 3, 0, 1)
    assert env.is_mpi


def test_slurm_with_compressed_lists():
    env = detect(SLURM)
    assert (env.source, env.rank, env.size, env.local_rank, env.node_rank) == ("slurm", 4, 7, 1, 2)
    assert env.nodes == ("gpu01", "gpu02", "gpu03", "cpu7")
    assert env.local_size == 2  # node 2 of "2(x3),1"
    assert env.store_addr == "gpu01"  # MASTER_ADDR defaults to the first node
    assert env.store_port is None and not env.is_mpi
    last_node = detect({**SLURM, "SLURM_NODEID": "3", "SLURM_PROCID": "6", "SLURM_LOCALID": "0"})
    assert last_node.local_size == 1
    given = detect({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert (given.store_addr, given.store_port) == ("head", 1234)
    job_only = dict(SLURM)
    del job_only["SLURM_STEP_NODELIST"]
    job_only["SLURM_JOB_NODELIST"] = "a,b"
    assert detect(job_only).nodes == ("a", "b")


def test_slurm_step_without_master_port_gets_the_steps_own_port():
    step = {**SLURM, "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "3"}
    assert detect(step).store_port == 20000 + 10 * 456 + 3  # the same on every task of the step
    other_step = detect({**step, "SLURM_STEP_ID": "4"}).store_port
    other_job = detect({**step, "SLURM_JOB_ID": "123457"}).store_port
    assert len({detect(step).store_port, other_step, other_job}) == 3
    assert detect({**step, "SLURM_STEP_ID": ""}).store_port == 20000 + 10 * 456  # a batch script
    assert detect({**step, "MASTER_PORT": "1234"}).store_port == 1234  # MASTER_PORT wins
    with pytest.raises(ConfigError, match=r"(?s)SLURM_JOB_ID='x1' is not an integer.*HINT"):
        detect({**step, "SLURM_JOB_ID": "x1"})


@pytest.mark.parametrize(
    "layers, expected",
    [
        ((ACCORD, TORCHRUN, OMPI, PMI, SLURM), "accord"),  # accordrun also sets torchrun's names
        ((TORCHRUN, OMPI, PMI, SLURM), "torchrun"),
        ((OMPI, PMI, SLURM), "openmpi"),  # mpirun inside a SLURM allocation
        ((PMI, SLURM), "mpich"),
        ((SLURM,), "slurm"),
    ],
)
def test_precedence_order(layers, expected):
    merged: dict[str, str] = {}
    for layer in reversed(layers):
        merged.update(layer)
    assert detect(merged).source == expected


def test_empty_values_count_as_unset():
    assert detect({**TORCHRUN, "ACCORD_RANK": "", "ACCORD_SIZE": ""}).source == "torchrun"
    assert detect({"RANK": "", "WORLD_SIZE": ""}).source == "single"


@pytest.mark.parametrize(
    "environ, text",
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
        ({"ACCORD_RANK": "two", "ACCORD_SIZE": "2"}, "ACCORD_RANK"),
        ({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"}, "rank 4 of size 4"),
        ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "rank 0 of size 0"),
        ({**OMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "local rank 2 of local size 2"),
    ],
)
def test_bad_values_raise_config_error_with_hint(environ, text):
    with pytest.raises(ConfigError, match="HINT:") as info:
        detect(environ)
    assert text in str(info.value)


def test_common_settings_apply_to_every_launcher():
    env = detect({**OMPI, "ACCORD_HOSTNAME": "fake", "ACCORD_SECRET_FILE": "/tmp/s"})
    assert (env.hostname, env.secret_file, env.secret_hex) == ("fake", "/tmp/s", None)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node[01-03],x", ["node01", "node02", "node03", "x"]),
        ("a", ["a"]),
        ("a,b,c", ["a", "b", "c"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("gpu[1,3-4,7]", ["gpu1", "gpu3", "gpu4", "gpu7"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("pre[1-2]-post,z[5]", ["pre1-post", "pre2-post", "z5"]),
        ("", []),
    ],
)
def test_expand_nodelist(text, expected):
    assert expand_nodelist(text) == expected


@pytest.mark.parametrize("text", ["a[1-2", "a]1[", "a[3-1]", "a[x]", "a[1-2-3]"])
def test_expand_nodelist_rejects_malformed_lists(text):
    with pytest.raises(ValueError, match="HINT:"):
        expand_nodelist(text)


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    assert expand_tasks_per_node("1,2(x2)") == [1, 2, 2]
    with pytest.raises(ValueError, match="HINT:"):
        expand_tasks_per_node("2(3)")


def detect_fake(environ):
    """A detector for a made-up launcher that sets FAKE_RANK."""
    if "FAKE_RANK" not in environ:
        return None
    return envs.JobEnvironment(source="fake", rank=int(environ["FAKE_RANK"]), size=2,
                               rendezvous=envs.RANK0_STORE)


def test_register_detector_in_a_chosen_place():
    saved = list(envs.DETECTORS)
    try:
        envs.register_detector("fake", detect_fake, before="openmpi")
        assert [n for n, _ in envs.DETECTORS][:3] == ["accord", "torchrun", "fake"]
        assert detect({**OMPI, "FAKE_RANK": "1"}).source == "fake"
        assert detect({**TORCHRUN, "FAKE_RANK": "1"}).source == "torchrun"
    finally:
        envs.DETECTORS[:] = saved


def test_register_detector_refuses_a_taken_name_unless_override():
    saved = list(envs.DETECTORS)
    try:
        with pytest.raises(ConfigError, match=r"(?s)cluster environment 'slurm' already has a detector.*"
                                              r"HINT: .*override=True"):
            envs.register_detector("slurm", detect_fake)
        with pytest.raises(ConfigError, match=r"(?s)unknown cluster environment 'pbs'; known: accord, "
                                              r"torchrun, openmpi, mpich, slurm.*HINT"):
            envs.register_detector("fake", detect_fake, before="pbs")
        assert envs.DETECTORS == saved  # nothing was added by the refused calls
        envs.register_detector("slurm", detect_fake, override=True)  # replaced in its place
        assert [n for n, _ in envs.DETECTORS] == [n for n, _ in saved]
        assert detect({**OMPI, "FAKE_RANK": "1"}).source == "openmpi"
        envs.register_detector("slurm", detect_fake, before="openmpi", override=True)  # and moved
        assert [n for n, _ in envs.DETECTORS] == ["accord", "torchrun", "slurm", "openmpi", "mpich"]
        assert detect({**OMPI, "FAKE_RANK": "1"}).source == "fake"
    finally:
        envs.DETECTORS[:] = saved


def test_pet_nproc_per_node_without_an_agent_fails_fast_with_a_hint():
    from accord.errors import ConfigError

    pod = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1",
           "KUBERNETES_PORT": "tcp://10.0.0.1:443"}
    assert detect(pod).source == "torchrun"  # one worker per pod: fine
    with pytest.raises(ConfigError, match="PET_NPROC_PER_NODE=2 asks for 2 workers") as info:
        detect({**pod, "PET_NPROC_PER_NODE": "2"})
    assert "HINT:" in str(info.value) and "accordrun" in str(info.value)
    assert detect({**pod, "PET_NPROC_PER_NODE": "2", "LOCAL_RANK": "0"}).source == "torchrun"  # under torchrun
