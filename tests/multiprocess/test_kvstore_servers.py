"""Parameter servers as real processes: dist_async, failures, refused secrets, PS_VERBOSE logs."""
import os
import time

import numpy as np
import pytest
from helpers.ports import held_port
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(60)


def _cluster(num_servers, num_workers, **kw):
    from accord.kvstore.cluster import LocalCluster

    return LocalCluster(num_servers, num_workers, **kw)


# --- dist_async on 3 workers and 2 servers, with PS_VERBOSE logs --------------------------------

def _async_worker(rank, size):
    import torch

    import accord.kvstore as kvs
    from accord.kvstore import optimizers

    kv = kvs.create("dist_async")
    kv.init("x", np.zeros(20, np.float32))  # 20 >= bound 16: split over both servers
    with pytest.raises(ValueError, match="optimizer"):
        kv.push("x", np.ones(20, np.float32))  # dist_async without an optimizer: clear, no hang
    kv.set_optimizer(optimizers.create("sgd", learning_rate=1.0))  # w -= grad
    with pytest.raises(ValueError, match="dist_sync"):
        kv.push("x", np.ones(20, np.float32), op="max")
    seen = []
    for _k in range(1, 6):
        kv.push("x", [torch.full((20,), rank + 1.0)])
        seen.append(kv.pull("x").copy())
    kv.barrier()
    final = kv.pull("x").copy()
    kv.close()
    return seen, final


def test_dist_async_applies_each_push_and_logs_connections(tmp_path):
    log_path = tmp_path / "servers.log"
    with open(log_path, "wb") as log, _cluster(2, 3, env={"ACCORD_VERBOSE": "1"}, stderr=log) as cl:
        env = cl.worker_env()
        env.update({"ACCORD_KVSTORE_BIGARRAY_BOUND": "16", "ACCORD_KVSTORE_TIMEOUT": "90"})
        results = run_ranks(_async_worker, 3, init="none", env=env, timeout=40)
        codes = cl.close()
    assert codes == [0, 0]  # SIGTERM: a clean stop
    total = 5 * (1 + 2 + 3)
    for rank, (seen, final) in enumerate(results):
        for k, value in enumerate(seen, start=1):
            # each pull includes this worker's own k pushes (others' may or may not be in)
            assert np.all(value <= -k * (rank + 1.0)) and np.all(value >= -total), (rank, k, value)
            # (the two servers' halves may hold different sets of the others' pushes)
        np.testing.assert_array_equal(final, np.full(20, -float(total)))
    text = log_path.read_text()
    assert "server 0 registered at tcp://127.0.0.1:" in text and "server 1 registered" in text
    for rank in range(3):
        assert f"worker rank {rank} connected" in text
    assert "accepted a connection" in text and "uses optimizer SGD(" in text


# --- a server dies: workers raise quickly, naming it ------------------------------------------

def _dying_worker(rank, size, victim_pid, tmp):
    import signal

    import torch

    import accord.kvstore as kvs
    from accord.errors import RankFailedError

    kv = kvs.create("dist_sync")
    kv.init("big", np.zeros(40, np.float32))
    kv.push("big", torch.ones(40))
    assert kv.pull("big")[0] == size
    open(os.path.join(tmp, f"pulled.{rank}"), "w").close()
    if rank == 0:  # once every worker has its answer, so that only the next round can fail
        while not all(os.path.exists(os.path.join(tmp, f"pulled.{r}")) for r in range(size)):
            time.sleep(0.01)
        os.kill(victim_pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        for _ in range(20):
            kv.push("big", torch.ones(40))
            kv.pull("big")
            time.sleep(0.05)
    return time.monotonic() - start, str(info.value)


def test_server_death_fails_workers_within_the_timeout(tmp_path, killed_tmpdir):
    with _cluster(2, 2, env={"TMPDIR": killed_tmpdir}) as cl:  # server 0 is SIGKILLed
        env = cl.worker_env()
        env.update({"ACCORD_KVSTORE_BIGARRAY_BOUND": "16", "ACCORD_KVSTORE_TIMEOUT": "90"})
        results = run_ranks(_dying_worker, 2, cl.servers[0].pid, str(tmp_path), init="none",
                            env=env, timeout=40)
    for _elapsed, message in results:
        assert "parameter server" in message and "HINT:" in message
        # noticed from the dropped connection, not at the 90 s timeout ("no answer ... within")
        assert "closed the connection" in message and "no answer" not in message, message


# --- errors the servers report: wrong size, unknown key ----------------------------------------

def _erring_worker(rank, size):
    import accord.kvstore as kvs
    from accord.kvstore.connection import ServerError

    kv = kvs.create("dist_sync")
    kv.init("k", np.zeros(4 if rank == 0 else 6, np.float32))  # rank 0's 4 elements win
    messages = []
    with pytest.raises(ValueError, match=r"(?s)not valid Unicode text.*HINT") as info:
        kv.push("k\ud800", np.ones(4, np.float32))  # before any server is asked
    assert not isinstance(info.value, UnicodeError)
    if rank == 1:
        kv.push("k", np.ones(6, np.float32))
        with pytest.raises(ServerError) as info:
            kv.pull("k")
        messages.append(str(info.value))
        seq, _ = kv._conns.request(0, "pull", {"ns": kv._space["ns"], "sync": True, "key": "s:ghost#0"})
        with pytest.raises(ServerError) as info:
            kv._conns.wait([seq])
        messages.append(str(info.value))
    kv.barrier()
    kv.close()
    return messages


def test_servers_refuse_wrong_sizes_and_unknown_keys():
    with _cluster(1, 2) as cl:
        env = dict(cl.worker_env(), ACCORD_KVSTORE_TIMEOUT="20")
        _, messages = run_ranks(_erring_worker, 2, init="none", env=env, timeout=40)
    assert "push of key 'k' with 6 elements, but it was initialised with 4" in messages[0]
    assert "unknown key 'ghost'" in messages[1] and "HINT:" in messages[1]


def _round_worker(rank, size):
    import accord.kvstore as kvs
    from accord.kvstore.connection import ServerError

    kv = kvs.create("dist_sync")
    kv.init("k", np.zeros(4, np.float32))
    with pytest.raises(ServerError) as info:
        if rank == 1:  # 6 elements, as a worker that got the shape wrong sends them
            fields = {**kv._space, "key": "s:k#0", "rop": "sum", "dtype": "<f4"}
            kv._conns.wait([kv._conns.request(0, "push", fields, [np.ones(6, np.float32)])[0]])
        else:
            kv.push("k", np.ones(4, np.float32))
            kv.pull("k")
    return str(info.value)


def test_a_push_one_worker_cannot_join_fails_the_round_for_every_worker_at_once():
    with _cluster(1, 2) as cl:
        # ACCORD_KVSTORE_TIMEOUT outlasts run_ranks' 50 s: rank 0 returns at all only if told
        env = dict(cl.worker_env(), ACCORD_KVSTORE_TIMEOUT="60")
        message0, message1 = run_ranks(_round_worker, 2, init="none", env=env, timeout=50)
    assert "with 6 elements, but it was initialised with 4" in message1 and "HINT:" in message1
    # told by the server, not timed out (which would say "no answer ... within")
    assert "the push of rank 1 in it was refused" in message0 and "no answer" not in message0, message0


# --- a wrong secret is refused (in this process: no torch, no threads) --------------------------

def test_wrong_secret_is_refused_and_the_server_keeps_serving():
    from accord.errors import AuthenticationError
    from accord.kvstore.connection import ServerConnections
    from accord.kvstore.directory import SERVER_KEY
    from accord.store.connection import StoreConnection

    with _cluster(1, 1) as cl:
        with StoreConnection("127.0.0.1", cl.store.port, cl.secret, timeout=10) as conn:
            endpoint = conn.get(SERVER_KEY.format(index=0)).decode()
        bad = ServerConnections([endpoint], b"x" * 32, rank=0, num_workers=1, timeout=10)
        good = ServerConnections([endpoint], cl.secret, rank=0, num_workers=1, timeout=10)
        try:
            # the refusal may come back before the request is sent (the handshake fails at
            # connect) or while waiting for the answer: either way it is this error
            with pytest.raises(AuthenticationError, match="(?s)refused.*HINT"):
                seq, _ = bad.request(0, "ping", {})
                bad.wait([seq])
            seq, _ = good.request(0, "ping", {})
            (header, _), = good.wait([seq])
            assert header["ok"] and header["server"] == 0
        finally:
            bad.close()
            good.close()



def test_workers_on_the_servers_host_use_its_unix_socket_and_others_tcp(tmp_path):
    import os
    import stat

    from accord.kvstore.connection import ServerConnections, pick_endpoint
    from accord.kvstore.directory import SERVER_KEY
    from accord.store.connection import StoreConnection

    with _cluster(1, 1) as cl:
        with StoreConnection("127.0.0.1", cl.store.port, cl.secret, timeout=10) as conn:
            advertised = conn.get(SERVER_KEY.format(index=0)).decode()
        tcp, ipc, to, limit = advertised.split("|")
        assert tcp.startswith("tcp://127.0.0.1:") and ipc.startswith("ipc://")
        assert len(to) == len("to=") + 32 and limit == f"max={64 * 1024 + 16 * (1 << 20)}"
        path = ipc[len("ipc://"):]
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700  # private to the user
        assert pick_endpoint(advertised) == ipc
        # A worker on another host does not see the path: it takes TCP.
        assert pick_endpoint(f"{tcp}|ipc://{tmp_path}/elsewhere.sock") == tcp
        assert pick_endpoint(tcp) == tcp
        for endpoint in (advertised, f"{tcp}|{to}"):  # both ways reach the same server
            conns = ServerConnections([endpoint], cl.secret, rank=0, num_workers=1, timeout=10)
            try:
                seq, _ = conns.request(0, "ping", {})
                (header, _), = conns.wait([seq])
                assert header["ok"] and header["server"] == 0
            finally:
                conns.close()
    assert not os.path.exists(os.path.dirname(path))  # the server removed its socket directory


# --- an MXNet-style job: DMLC_* variables, a scheduler, the script run as a server -------------

def _mxnet_style_worker(rank, size):
    import accord.kvstore as kvs
    from accord.kvstore.client import finalize

    kv = kvs.create("dist_sync")
    kv.init(0, np.zeros(30, np.float32))
    kv.push(0, np.full(30, rank + 1.0, np.float32))
    value = kv.pull(0)
    kv.close()
    finalize()  # what happens at exit: meet, then rank 0 stops the servers
    return value


def test_mxnet_style_launch_with_dmlc_variables(tmp_path):
    import secrets
    import subprocess
    import sys

    from accord import config
    from accord.kvstore.cluster import start_servers

    port = held_port()  # the scheduler's port, as launch.py picks one (held from other tests)
    env = {k: v for k, v in config.snapshot().items() if not k.startswith(("ACCORD_", "DMLC_"))}
    env.update({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "2",
                "ACCORD_JOB_SECRET": secrets.token_hex(32), "MXNET_KVSTORE_BIGARRAY_BOUND": "10"})
    procs = [subprocess.Popen([sys.executable, "-m", "accord.kvstore.server"],
                              env={**env, "DMLC_ROLE": "scheduler"})]
    try:
        procs += start_servers(1, env)
        # the training script itself, run as a server: it serves from create() and exits
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "import accord.kvstore as k; k.create('dist_sync'); raise SystemExit(3)"],
            env={**env, "DMLC_ROLE": "server"}))
        worker_env = {k: v for k, v in env.items() if k.startswith(("DMLC_", "ACCORD_", "MXNET_"))}
        results = run_ranks(_mxnet_style_worker, 2, init="none", timeout=40,
                            env={**worker_env, "DMLC_ROLE": "worker"})
        codes = [p.wait(20) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for value in results:
        np.testing.assert_array_equal(value, np.full(30, 3.0))
    assert codes == [0, 0, 0]  # the servers stopped, then the scheduler saw it and left
