"""The worker environment contract, built without starting anything."""
from types import SimpleNamespace

import pytest

from accord import config
from accord.run.job_start import JobStarter
from accord.run.spec.assignment import Slot, assign_slots
from accord.run.spec.hosts import HostSlots
from accord.run.spec.tuning import Tuning, tuning_env
from accord.run.spec.worker_env import (
    JobEnv,
    forwarded_env,
    local_environment,
    omp_threads,
    pick_device,
    worker_env,
)

JOB = JobEnv(job_id="j1", master_addr="10.0.0.1", master_port=29500, store_addr="10.0.0.1", store_port=4000)


def test_contract_for_a_two_host_job():
    slots = assign_slots([HostSlots("a", 2), HostSlots("b", 1)], 3)
    env = worker_env(slots[2], JOB, cpu_count=8)
    expected = {
        "ACCORD_RANK": "2", "ACCORD_SIZE": "3", "ACCORD_LOCAL_RANK": "0", "ACCORD_LOCAL_SIZE": "1",
        "ACCORD_CROSS_RANK": "1", "ACCORD_CROSS_SIZE": "2", "ACCORD_HOSTNAME": "b",
        "ACCORD_STORE_ADDR": "10.0.0.1", "ACCORD_STORE_PORT": "4000", "ACCORD_JOB_ID": "j1",
        "HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "b",
        "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "8",
    }
    assert env == expected
    assert "ACCORD_JOB_SECRET" not in env


def test_contract_reads_back_through_config():
    slots = assign_slots([HostSlots("a", 4)], 4)
    env = worker_env(slots[3], JOB, tuning=Tuning(fusion_threshold_mb=32, cycle_time_ms=2.5))
    assert config.get("ACCORD_RANK", env) == 3
    assert config.get("ACCORD_LOCAL_SIZE", env) == 4
    assert config.get("ACCORD_FUSION_THRESHOLD", env) == 32 * 1024 * 1024
    assert config.get("ACCORD_CYCLE_TIME", env) == 2.5


@pytest.mark.parametrize("cores, local, threads", [(2, 2, 1), (2, 4, 1), (16, 4, 4), (8, 3, 2), (1, 1, 1)])
def test_omp_threads(cores, local, threads):
    assert omp_threads(cores, local) == threads


def test_user_omp_setting_wins():
    slot = assign_slots([HostSlots("a", 2)], 2)[0]
    assert "OMP_NUM_THREADS" not in worker_env(slot, JOB, user_env={"OMP_NUM_THREADS": "3"}, cpu_count=8)
    assert worker_env(slot, JOB, user_env={}, cpu_count=8)["OMP_NUM_THREADS"] == "4"


def test_devices_one_per_local_rank_and_error_file():
    slots = assign_slots([HostSlots("a", 2), HostSlots("b", 2)], 4)
    got = [worker_env(s, JOB, devices=("2", "3"), error_file=f"/e{s.rank}")["CUDA_VISIBLE_DEVICES"] for s in slots]
    assert got == ["2", "3", "2", "3"]
    assert worker_env(slots[1], JOB, error_file="/tmp/e1")["ACCORD_ERROR_FILE"] == "/tmp/e1"


def test_tuning_flags_map_to_variables():
    env = tuning_env(Tuning(
        fusion_threshold_mb=0.5, cycle_time_ms=5, timeline_filename="/t.json", stall_check_warning_time_seconds=30,
        stall_check_shutdown_time_seconds=90, no_stall_check=True, hierarchical_allreduce=True,
        log_level="debug", network_interface="eth0", verbose=True, start_timeout=12.5,
    ))
    assert env == {
        "ACCORD_FUSION_THRESHOLD": str(512 * 1024), "ACCORD_CYCLE_TIME": "5", "ACCORD_TIMELINE": "/t.json",
        "ACCORD_STALL_CHECK_TIME_SECONDS": "30", "ACCORD_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "ACCORD_STALL_CHECK_DISABLE": "1", "ACCORD_HIERARCHICAL_ALLREDUCE": "1", "ACCORD_LOG_LEVEL": "debug",
        "ACCORD_INTERFACE": "eth0", "ACCORD_VERBOSE": "1", "ACCORD_START_TIMEOUT": "12.5",
    }
    for name, text in env.items():  # every value parses as the declared type
        config.get(name, {name: text})
    assert tuning_env(Tuning()) == {}


def test_local_env_has_secret_and_drops_foreign_secret_file():
    base = {"PATH": "/bin", "ACCORD_SECRET_FILE": "/old", "ACCORD_RANK": "9"}
    env = local_environment(base, {"ACCORD_RANK": "1"}, "ab" * 32)
    assert env == {"PATH": "/bin", "ACCORD_RANK": "1", "ACCORD_JOB_SECRET": "ab" * 32}


def test_remote_env_forwards_chosen_variables_never_the_secret():
    base = {"PATH": "/bin", "HOME": "/root", "PYTHONPATH": "/src", "NCCL_DEBUG": "INFO",
            "ACCORD_JOB_SECRET": "leak", "ACCORD_SECRET_FILE": "/s", "HOROVOD_CYCLE_TIME": "2"}
    added = {"ACCORD_RANK": "1", "ACCORD_ERROR_FILE": "/local/path", "ACCORD_JOB_SECRET": "leak"}
    assert forwarded_env(base, added) == {"PATH": "/bin", "PYTHONPATH": "/src", "NCCL_DEBUG": "INFO",
                                          "HOROVOD_CYCLE_TIME": "2", "ACCORD_RANK": "1"}
    venv = {"VIRTUAL_ENV": "/v", "CONDA_PREFIX": "/c", "CONDA_DEFAULT_ENV": "c", "USER": "me"}
    assert forwarded_env(venv, {}) == {"VIRTUAL_ENV": "/v", "CONDA_PREFIX": "/c", "CONDA_DEFAULT_ENV": "c"}


def test_spawn_and_accordrun_take_their_tuning_from_one_table():
    import argparse

    from accord.errors import ConfigError
    from accord.run.cli import build_parser
    from accord.run.spec import tuning

    # every row is a Tuning field and an accord.spawn keyword; the tuning group's rows are flags
    assert [f for f in Tuning.__dataclass_fields__] == [o.name for o in tuning.OPTIONS]
    parser = build_parser()
    flags = {a.dest: a.option_strings for a in parser._actions}
    for option in tuning.OPTIONS:
        config.get(option.variable, {})  # every variable is one accord.config declares
        if option.cli:
            assert flags[option.name] == [option.flag]
    assert tuning.make_tuning({"cycle_time_ms": 2}, "spawn") == Tuning(cycle_time_ms=2)
    with pytest.raises(ConfigError, match=r"(?s)spawn got unknown tuning options \['cycle_ms'\].*HINT"):
        tuning.make_tuning({"cycle_ms": 2}, "spawn")
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(ConfigError, match="--cycle-time-ms must be"):
            tuning.make_tuning({"cycle_time_ms": bad}, "spawn")
    assert isinstance(parser, argparse.ArgumentParser)


def test_a_joining_worker_gets_a_device_no_survivor_holds():
    # survivors keep devices "0" and "2" after a re-formation; the joiner's local rank 1 names
    # "1", free; local rank 0 names "0", busy: the first free one instead
    devices = ("0", "1", "2", "3")
    assert pick_device(devices, {"0", "2"}, 1) == "1"
    assert pick_device(devices, {"0", "2"}, 0) == "1"
    assert pick_device(devices, {"0", "1", "2"}, 2) == "3"
    assert pick_device(devices, set(), 3) == "3"  # nothing busy: the fixed job's choice
    assert pick_device(("0", "1"), {"0", "1"}, 1) == "1"  # none free (leaving workers): its own


class _Members:
    """A supervisor stand-in: members with a host and a returncode, nothing started."""

    def __init__(self):
        self.started = []

    def start(self, kind, index, label, host, argv, environ, added, options, error_file):
        pipes = SimpleNamespace(stdout=None, stderr=None)
        member = SimpleNamespace(index=index, host=host, returncode=None, proc=pipes)
        self.started.append((member, added))
        return member


def test_elastic_workers_on_one_host_never_share_a_device(tmp_path):
    cfg = SimpleNamespace(devices=("0", "1"), tuning=Tuning(), min_np=1, worker_command=("python3", "t.py"),
                          elastic=SimpleNamespace(elastic_timeout=600.0, elastic_timeout_given=False))
    members = _Members()
    mux = SimpleNamespace(add=lambda *a, **k: None, open_files=lambda *a, **k: {})
    starter = JobStarter(cfg, members, None, mux, str(tmp_path), lambda line: None)

    def slot(local_rank, rank, size):
        return Slot(rank=rank, size=size, local_rank=local_rank, local_size=size, cross_rank=0, cross_size=1,
                    hostname="h1", host_index=0)

    first = starter.elastic_worker(JOB, {}, 0, slot(0, 0, 2), False)
    second = starter.elastic_worker(JOB, {}, 1, slot(1, 1, 2), False)
    first.returncode = 1  # worker 0 (device "0") fails; worker 1 survives as local rank 0
    starter.elastic_worker(JOB, {}, 2, slot(1, 1, 2), True)  # the joiner is planned local rank 1
    second.returncode = 1  # then worker 1 ("1") fails; worker 2 ("0") becomes local rank 0
    starter.elastic_worker(JOB, {}, 3, slot(1, 1, 2), True)
    devices = [added["CUDA_VISIBLE_DEVICES"] for _, added in members.started]
    # each joiner takes the device the failed worker freed, not the survivor's, whatever its
    # planned local rank names
    assert devices == ["0", "1", "0", "1"]
