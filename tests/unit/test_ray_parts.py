"""accord.ray's pure parts, without Ray: the rank layout, node slots and blacklist, settings and
argument checks, the lazy import and the error a missing Ray gives."""
import subprocess
import sys

import pytest

from accord.errors import ConfigError
from accord.ray import layout, requirement
from accord.ray.discovery import Nodes, slots_of
from accord.ray.settings import create_settings


def _described(nodes_ips, gpus=None):
    return [{"node_id": n, "ip": ip, "gpu_ids": (gpus or {}).get(i, []), "pid": 100 + i}
            for i, (n, ip) in enumerate(nodes_ips)]


def test_ranks_fill_nodes_in_order_of_first_appearance():
    described = _described([("a", "10.0.0.1"), ("b", "10.0.0.2"), ("a", "10.0.0.1"), ("b", "10.0.0.2")])
    assert layout.rank_order(described) == [0, 2, 1, 3]
    placed = layout.place(described)
    assert [(p.actor, p.slot.rank, p.slot.local_rank, p.slot.hostname, p.slot.cross_rank) for p in placed] == [
        (0, 0, 0, "10.0.0.1", 0), (2, 1, 1, "10.0.0.1", 0), (1, 2, 0, "10.0.0.2", 1), (3, 3, 1, "10.0.0.2", 1)]


def test_two_ray_nodes_of_one_machine_are_one_host_to_accord():
    placed = layout.place(_described([("a", "10.0.0.1"), ("b", "10.0.0.1")]))
    assert [(p.slot.local_rank, p.slot.local_size, p.slot.cross_size) for p in placed] == [(0, 2, 1), (1, 2, 1)]


def test_every_worker_of_a_host_sees_its_hosts_gpus_in_local_rank_order():
    described = _described([("a", "h1"), ("a", "h1"), ("b", "h2")], gpus={0: ["3"], 1: ["1"], 2: ["0"]})
    placed = layout.place(described)
    devices = layout.visible_devices(described, placed)
    assert devices == {0: "3,1", 1: "3,1", 2: "0"}  # local rank 1 (actor 1) is device index 1 = GPU 1


def test_a_workers_environment_is_the_contract_with_the_secret_and_extras():
    from accord.run.spec.worker_env import JobEnv

    slot = layout.place(_described([("a", "10.0.0.1"), ("a", "10.0.0.1")]))[1].slot
    job = JobEnv(job_id="j", master_addr="10.0.0.1", master_port=1234, store_addr="127.0.0.1", store_port=99)
    env = layout.environment(slot, job, "ab" * 32, {"ACCORD_START_TIMEOUT": "30"})
    assert env["ACCORD_RANK"] == env["RANK"] == env["HOROVOD_RANK"] == "1" and env["ACCORD_SIZE"] == "2"
    assert env["ACCORD_STORE_ADDR"] == "127.0.0.1" and env["ACCORD_STORE_PORT"] == "99"
    assert env["ACCORD_JOB_SECRET"] == "ab" * 32 and env["ACCORD_START_TIMEOUT"] == "30"


def test_node_slots_follow_cpus_and_gpus_per_worker():
    assert slots_of({"CPU": 8.0}, 2, 0) == 4
    assert slots_of({"CPU": 8.0, "GPU": 2.0}, 1, 1) == 2
    assert slots_of({"CPU": 1.0}, 2, 0) == 0
    assert slots_of({"CPU": 4.0}, 0, 1) == 0  # GPUs asked, none there


class _FakeRay:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_nodes_keep_first_seen_order_and_the_blacklist_its_cooldown():
    n = lambda i, cpus, alive=True: {"NodeID": f"n{i}", "NodeManagerAddress": f"10.0.0.{i}",  # noqa: E731
                                     "Alive": alive, "Resources": {"CPU": cpus}}
    nodes = Nodes(cpus_per_worker=1, gpus_per_worker=0, cooldown_range=(10.0, 300.0))
    assert [x.node_id for x in nodes.live(_FakeRay([n(2, 2), n(1, 1)]))] == ["n2", "n1"]
    assert [(x.node_id, x.slots) for x in nodes.live(_FakeRay([n(1, 1), n(3, 1), n(2, 2, alive=False)]))] == [
        ("n1", 1), ("n3", 1)]
    until = nodes.blacklist("n1", now=100.0)
    assert 120.0 <= until <= 130.0  # the first failure: MIN * 2 plus up to MIN
    assert nodes.blocked("n1", until - 0.1) and not nodes.blocked("n1", until + 0.1)
    forever = Nodes(cpus_per_worker=1, gpus_per_worker=0)
    assert forever.blacklist("n1", 0.0) is None and forever.blocked("n1", 1e9)


def test_settings_are_horovods_and_checked():
    s = create_settings(timeout_s=12, nics={"eth0"}, ssh_str="not written anywhere", ssh_identity_file="/nonexistent")
    assert s.worker_variables() == {"ACCORD_START_TIMEOUT": "12", "ACCORD_INTERFACE": "eth0"}
    assert s.placement_group_timeout_s == 100
    with pytest.raises(ConfigError, match="timeout_s must be a positive"):
        create_settings(timeout_s=0)
    with pytest.raises(ConfigError, match="one interface"):
        create_settings(nics={"eth0", "eth1"})


def test_the_executors_argument_rules_are_horovods():
    from accord.ray import RayExecutor

    s = RayExecutor.create_settings(timeout_s=30)
    for kwargs, match in [({"max_workers": 2}, "needs a positive min_workers"),
                          ({"min_workers": 1, "num_workers": 2}, "both min_workers and num_workers"),
                          ({"num_workers": 2, "gpus_per_worker": 1}, "use_gpu is False"),
                          ({"num_workers": 2, "use_gpu": True, "gpus_per_worker": 0.5}, "gpus_per_worker must be"),
                          ({}, "needs num_workers"),
                          ({"min_workers": 2, "max_workers": 1}, "below min_workers")]:
        with pytest.raises(ValueError, match=match):  # ConfigError is a ValueError, as Horovod's
            RayExecutor(s, **kwargs)
    assert RayExecutor(s, min_workers=1, max_workers=4).settings.elastic


def test_importing_accord_and_accord_torch_does_not_import_ray():
    code = ("import sys, accord, accord.torch, accord.ray; from accord.ray import layout, settings; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_a_missing_ray_is_an_import_error_with_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ImportError) as info:
        requirement.need_ray()
    assert "pip install 'accord[ray]'" in str(info.value) and "\nHINT: " in str(info.value)


class _CallRay:
    """Just what StaticJob.call uses of Ray: refs resolve to outcomes, first come first waited."""

    class exceptions:  # noqa: N801 - Ray's own spelling
        class RayError(Exception):
            pass

        class RayActorError(RayError):
            pass

    def __init__(self, outcomes):
        self.outcomes = outcomes  # ref -> ("ok"/"error", value) or an exception to raise
        self.timeouts = []

    def wait(self, refs, num_returns=1, timeout=None):
        self.timeouts.append(timeout)
        ordered = sorted(refs)
        return ordered[:num_returns], ordered[num_returns:]

    def get(self, ref):
        outcome = self.outcomes[ref]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class _Actor:
    def __init__(self, ref):
        self.call = type("M", (), {"remote": staticmethod(lambda *a: ref)})()


def _job_with(fake, monkeypatch):
    from accord.ray import static

    monkeypatch.setattr(static, "need_ray", lambda: fake)
    job = static.StaticJob(create_settings(), 2, None, 1, 1, False, 0, False)
    job.workers = [_Actor(ref) for ref in sorted(fake.outcomes)]
    job.descriptions = [{"ip": "10.0.0.1", "pid": 100}, {"ip": "10.0.0.2", "pid": 101}]
    job.stopped = []
    monkeypatch.setattr(job, "_stop", lambda ray: job.stopped.append(True))
    return job


def test_a_rank_that_lost_its_peer_yields_to_the_peers_own_death(monkeypatch):
    from accord.errors import RankFailedError, WorkerFailedError
    from accord.ray.actor import describe_exception

    peer_lost = describe_exception(RankFailedError("a collective failed on rank 0 of 2: rank 1 stopped answering"))
    fake = _CallRay({0: ("error", peer_lost), 1: _CallRay.exceptions.RayActorError("actor died")})
    job = _job_with(fake, monkeypatch)
    with pytest.raises(WorkerFailedError) as info:
        job.call(print, (), {}, False)
    assert info.value.rank == 1 and "rank 1 of 2 (node 10.0.0.2, pid 101) died" in str(info.value)
    assert job.stopped == [True] and fake.timeouts[-1] is not None  # the wait for the cause is bounded


def test_a_peer_lost_error_is_raised_when_no_other_rank_fails(monkeypatch):
    from accord.errors import RankFailedError, WorkerFailedError
    from accord.ray.actor import describe_exception

    peer_lost = describe_exception(RankFailedError("a collective failed on rank 0 of 2"))
    fake = _CallRay({0: ("error", peer_lost), 1: ("ok", 7)})
    with pytest.raises(WorkerFailedError) as info:
        _job_with(fake, monkeypatch).call(print, (), {}, False)
    assert info.value.rank == 0 and "RankFailedError" in str(info.value)


def test_an_error_of_its_own_is_raised_at_once(monkeypatch):
    from accord.errors import WorkerFailedError
    from accord.ray.actor import describe_exception

    fake = _CallRay({0: ("error", describe_exception(ValueError("bad input"))),
                     1: _CallRay.exceptions.RayActorError("actor died")})
    with pytest.raises(WorkerFailedError) as info:
        _job_with(fake, monkeypatch).call(print, (), {}, False)
    assert info.value.rank == 0 and "ValueError: bad input" in str(info.value)
    assert fake.timeouts == [None]  # no wait for other ranks
