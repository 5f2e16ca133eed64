"""Failures injected into real accordrun jobs at moments the launcher tests do not reach: inside a
collective, inside the shm backend's set-up, during a worker's exit. The job must stop fast with the
failing rank as the root cause, its survivors must not wait out a timeout, and nothing may be left
behind (processes, /dev/shm segments). "Fast": these tests raise the collective timeout beyond
the bound on the whole accordrun job (its ``timeout=``), so a job that returns at all did not wait
one out, and the output says what ended the wait.

The worker scripts are written to the test's folder; they inject the failure themselves (a patched
library call, a signal to their own process) so that the moment is exact.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import textwrap
from pathlib import Path

import pytest
from helpers import leftovers

from accord import worker_contract

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

# Rank 1's gradient allreduce of step 2 fails on rank 1 only (as when its connection to a third,
# killed rank breaks), while rank 0 waits in that same allreduce for rank 1's data. Rank 1 leaves
# the collective, hvd.elastic.run shuts it down and re-forms the job: rank 0 must learn at once
# that rank 1 left, not after ACCORD_COLLECTIVE_TIMEOUT.
LOCAL_FAILURE = """
import json
import torch
import accord.torch as hvd
from accord.comm import torch_backend

torch.set_num_threads(1)
hvd.init()
first = hvd.rank()
model = torch.nn.Linear(512, 512)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0)
real = torch_backend.TorchCommunicator._allreduce_native
armed = [first == 1]

def fail_once(self, tensor, op):
    if armed[0] and state.step == 2 and tensor.numel() >= 512 * 512:
        armed[0] = False
        raise RuntimeError("injected: this rank lost a connection")
    return real(self, tensor, op)

torch_backend.TorchCommunicator._allreduce_native = fail_once

@hvd.elastic.run
def train(state):
    while state.step < 4:
        model(torch.randn(8, 512)).sum().backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.step += 1
        state.commit()

train(state)
print("DONE " + json.dumps({"rank": first, "size": hvd.size()}), flush=True)
hvd.shutdown()
"""

# Rank 1 ends (sys.exit(3), or an uncaught exception) while rank 0 waits in a collective rank 1
# never submits. Rank 1's accord shuts down first at exit, so rank 0 fails (ShutdownError) and
# exits while rank 1's process is still ending (its slow part: the sleep registered before init
# runs after accord's shutdown).
SLOW_EXIT = """
import atexit, os, sys, time
import torch
import accord.torch as hvd

rank = int(os.environ["ACCORD_RANK"])
if rank == 1:
    atexit.register(time.sleep, 1.0)
hvd.init()
hvd.allreduce(torch.ones(2), name="warm-up")
if rank == 1:
    if sys.argv[1] == "exit":
        sys.exit(3)
    raise ValueError("bad batch on rank 1")
hvd.allreduce(torch.ones(4), name="never answered")
"""

# The shm backend's leader (rank 0) is killed right after creating its segment, before it has
# shared the segment's name with its peers: nobody can unlink it but the launcher.
LEADER_KILLED = """
import os, signal
import accord.torch as hvd
from accord.comm.shm import segment as shm_segment

if os.environ["ACCORD_RANK"] == "0":
    real = shm_segment.create_segment

    def create_and_die(layout):
        real(layout)
        os.kill(os.getpid(), signal.SIGKILL)

    shm_segment.create_segment = create_and_die
hvd.init()
"""

# A worker dies by a signal in the middle of a 64 MB allreduce while its peers are in it.
MID_COLLECTIVE = """
import os, signal, sys, threading, time
import torch
import accord.torch as hvd

hvd.init()
rank = hvd.rank()
big = torch.ones(16 << 20)
hvd.allreduce(big, name="warm-up")
if rank == 1:
    threading.Timer(0.3, os.kill, (os.getpid(), getattr(signal, sys.argv[1]))).start()
for step in range(1000):
    hvd.allreduce(big, name=f"big.{step}")
"""


# Rank 1 stops itself (SIGSTOP) between two allreduces: it fails nothing, its peers' waits end at
# the collective timeout, and their errors come first.
FROZEN = """
import os, signal
import torch
import accord.torch as hvd

hvd.init()
hvd.allreduce(torch.ones(2), name="warm-up")
if hvd.rank() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
hvd.allreduce(torch.ones(2), name="never answered")
"""

def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _cause(stderr: str) -> str:
    assert "Root Cause (first observed failure):" in stderr, stderr[-3000:]
    return stderr.split("Root Cause (first observed failure):", 1)[1]


def _env(tmpdir: str, **extra: str) -> dict[str, str]:
    return lib.cli_env(TMPDIR=tmpdir, **extra)


@pytest.mark.timeout(180)
def test_a_rank_leaving_a_broken_collective_frees_its_peer_at_once(tmp_path, killed_tmpdir):
    script = _write(tmp_path, "local_failure.py", LOCAL_FAILURE)
    # rank 0 must not wait for ACCORD_COLLECTIVE_TIMEOUT in the allreduce rank 1 has left: at
    # 300 s it outlasts the job's 150 s bound, so only a rank 0 told at once finishes
    env = _env(killed_tmpdir, ACCORD_CPU_BACKEND="gloo", ACCORD_COLLECTIVE_TIMEOUT="300",
               ACCORD_ELASTIC_TIMEOUT="30")
    proc = lib.accordrun("-np", "2", "--min-np", "2", lib.PYTHON, script, timeout=150, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [json.loads(line.split("DONE ", 1)[1]) for line in proc.stdout.splitlines() if "DONE {" in line]
    assert sorted(d["rank"] for d in done) == [0, 1] and all(d["size"] == 2 for d in done), proc.stdout
    assert "Timed out" not in proc.stderr, proc.stderr[-3000:]  # no wait ran out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how, status, error", [
    ("exit", 3, None),
    ("raise", 1, "error      : ValueError: bad batch on rank 1"),
])
def test_the_rank_that_ended_is_the_root_cause_even_when_its_peer_exits_first(
        tmp_path, killed_tmpdir, how, status, error):
    script = _write(tmp_path, "slow_exit.py", SLOW_EXIT)
    # the 120 s collective timeout outlasts the job's 50 s bound: rank 0 did not wait it out
    proc = lib.accordrun("-np", "2", lib.PYTHON, script, how, timeout=50,
                         env=_env(killed_tmpdir, ACCORD_COLLECTIVE_TIMEOUT="120"))
    cause = _cause(proc.stderr)
    assert proc.returncode == status, proc.stderr[-3000:]
    assert "rank       : 1 (local_rank 1, host localhost)" in cause, cause
    assert f"status     : exit code {status}" in cause
    if error:
        assert error in cause
    assert "rank 0 (host localhost" in cause  # listed among the other failures
    # rank 0's own error names what happened, not a shutdown() it never called
    assert "another rank of [0, 1] shut down while this request was pending on rank 0" in proc.stderr


@pytest.mark.timeout(60)
def test_a_leader_killed_while_creating_its_segment_leaves_nothing_in_dev_shm(tmp_path, killed_tmpdir):
    script = _write(tmp_path, "leader_killed.py", LEADER_KILLED)
    proc = lib.accordrun("-np", "2", lib.PYTHON, script, timeout=50,
                         env=_env(killed_tmpdir, ACCORD_CPU_BACKEND="shm"))
    cause = _cause(proc.stderr)
    pid = int(re.search(r"pid\s+: (\d+)", cause).group(1))
    prefix = f"{worker_contract.SHM_SEGMENT_PREFIX}{pid}-"
    try:
        assert proc.returncode == 128 + signal.SIGKILL, proc.stderr[-3000:]
        assert "rank       : 0 (local_rank 0, host localhost)" in cause
        left = [n for n in os.listdir(worker_contract.shm_segment_dir()) if n.startswith(prefix)]
        assert left == [], "the killed leader's segment was left behind"
    finally:
        worker_contract.remove_shm_segments(pid)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend, sig", [("shm", "SIGSEGV"), ("gloo", "SIGKILL")])
def test_a_rank_killed_mid_collective_stops_the_job_fast_and_leaves_nothing(
        tmp_path, killed_tmpdir, backend, sig):
    script = _write(tmp_path, "mid_collective.py", MID_COLLECTIVE)
    segments = leftovers.shm_segments()
    # the 120 s collective timeout outlasts the job's 50 s bound: the survivors did not wait it out
    proc = lib.accordrun("-np", "3", lib.PYTHON, script, sig, timeout=50,
                         env=_env(killed_tmpdir, ACCORD_CPU_BACKEND=backend, ACCORD_COLLECTIVE_TIMEOUT="120"))
    number = getattr(signal, sig)
    assert proc.returncode == 128 + number, proc.stderr[-3000:]
    cause = _cause(proc.stderr)
    assert "rank       : 1 (local_rank 1, host localhost)" in cause
    assert f"killed by {sig} (signal {number})" in cause
    assert "Stopped by the launcher: ranks 0, 2" in cause or "Other failures:" in cause
    assert leftovers.shm_segments() - segments == set()
    assert [n for n in os.listdir(killed_tmpdir) if n.startswith("accord-")] == []


@pytest.mark.timeout(90)
def test_a_frozen_rank_is_the_root_cause_not_the_peer_whose_wait_timed_out(tmp_path, killed_tmpdir):
    script = _write(tmp_path, "frozen.py", FROZEN)
    proc = lib.accordrun("-np", "3", "--grace-period", "1", lib.PYTHON, script, timeout=80,
                         env=_env(killed_tmpdir, ACCORD_CPU_BACKEND="shm", ACCORD_COLLECTIVE_TIMEOUT="3"))
    cause = _cause(proc.stderr)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the peers' status: the stop was the launcher's
    assert "rank       : 1 (local_rank 1, host localhost)" in cause, cause
    assert "did not answer rank(s) [" in cause and "still running (frozen?)" in cause, cause
    assert "HINT: look at what rank 1 was doing on localhost" in cause
    assert "rank 0 (host localhost" in cause and "rank 2 (host localhost" in cause  # its peers' failures
    assert "Stopped by the launcher: ranks 1" in cause
