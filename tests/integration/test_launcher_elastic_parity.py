"""Elastic jobs behave as under horovodrun (found by running Horovod's own elastic integration
test against accord; see docs/horovod-parity.md):

- ``--min-np`` with ``-H`` naming two or more hosts is an elastic job on those fixed hosts: it
  starts on every slot (``-np`` is only the fewest it needs), a failing worker's host is
  blacklisted (its other workers leave with status 0), and the survivors re-form once;
- a DistributedOptimizer built while the job has one worker averages gradients once the job has
  grown (workers are marked elastic, HOROVOD_ELASTIC=1, as horovodrun marks them; with --min-np
  on one host too).
"""
import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

WORKER = lib.script("elastic_parity.py")


def _done(stdout):
    return sorted((json.loads(line.split("DONE ", 1)[1]) for line in stdout.splitlines() if "DONE {" in line),
                  key=lambda d: d["rank"])


def _w_after(sizes):
    """w after steps at these world sizes: rank r's gradient is r + 1, averaged, lr 1."""
    return -sum((n + 1) / 2 for n in sizes)


@pytest.mark.timeout(150)
def test_min_np_on_two_hosts_starts_every_slot_and_a_failure_blacklists_its_host():
    proc = lib.accordrun("-np", "2", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2", "--grace-period", "2",
                         lib.PYTHON, WORKER, "--steps", "5", "--die-id", "0", "--die-step", "2", timeout=130)
    assert proc.returncode == 0, proc.stderr[-4000:]
    done = _done(proc.stdout)
    assert [(d["start_rank"], d["rank"], d["size"]) for d in done] == [(2, 0, 2), (3, 1, 2)]
    sizes = [4, 4, 2, 2, 2]  # all 4 slots (not -np 2), then the 2 workers of 127.0.0.1
    for d in done:
        assert d["sizes"] == sizes
        assert d["w"] == pytest.approx(_w_after(sizes))  # -9.5
        assert d["resets"] == [2]  # one re-formation, not a second one for worker 1's removal
    assert ("elastic: worker 0 on localhost ended (exit code 1); blacklisting localhost for the rest "
            "of the job") in proc.stderr
    assert "elastic: hosts left the job: stopping workers [1] on ['localhost']" in proc.stderr
    assert "elastic: the job finished on workers [2, 3] (--min-np 2) without rank 0 on localhost" in proc.stderr


@pytest.mark.timeout(120)
def test_an_optimizer_built_by_a_lone_worker_averages_once_the_job_grows(tmp_path):
    """Without hooks on the first worker, its step would not be averaged and the joiner's
    allreduce would wait for it: the job stalls (then fails, ACCORD_STALL_SHUTDOWN_TIME_SECONDS)."""
    marker = tmp_path / "grow"
    discover = tmp_path / "discover.sh"
    discover.write_text(f"if [ -e {marker} ]; then echo localhost:2; else echo localhost:1; fi\n")
    proc = lib.accordrun("-np", "1", "--max-np", "2", "--host-discovery-script", f"sh {discover}",
                         "--discovery-interval", "0.2", "--grace-period", "2",
                         lib.PYTHON, WORKER, "--steps", "3", "--grow-marker", str(marker), timeout=90,
                         env=lib.cli_env(ACCORD_STALL_SHUTDOWN_TIME_SECONDS="20"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    done = _done(proc.stdout)
    assert [(d["start_rank"], d["rank"], d["size"]) for d in done] == [(0, 0, 2), (1, 1, 2)]
    for d in done:
        assert d["sizes"] == [2, 2, 2]
        assert d["w"] == pytest.approx(_w_after([2, 2, 2]))  # -4.5 on both: averaged every step
    assert done[0]["resets"] == [2]


@pytest.mark.timeout(60)
def test_workers_of_an_elastic_job_are_marked_as_horovodrun_marks_them():
    show = "import os; print('FLAGS', os.environ.get('HOROVOD_ELASTIC'), os.environ.get('ACCORD_ELASTIC'))"
    elastic = lib.accordrun("-np", "2", "--min-np", "1", lib.PYTHON, "-c", show, timeout=50)
    plain = lib.accordrun("-np", "2", lib.PYTHON, "-c", show, timeout=50)
    assert elastic.returncode == 0 and plain.returncode == 0, elastic.stderr + plain.stderr
    assert elastic.stdout.count("FLAGS 1 1") == 2
    assert plain.stdout.count("FLAGS None None") == 2  # HOROVOD_ELASTIC only where the job is elastic


JOINER = lib.script("elastic_joiner_env.py")
_COORDS = {"rank": "HOROVOD_RANK", "size": "HOROVOD_SIZE", "local_rank": "HOROVOD_LOCAL_RANK",
           "local_size": "HOROVOD_LOCAL_SIZE", "cross_rank": "HOROVOD_CROSS_RANK", "cross_size": "HOROVOD_CROSS_SIZE"}


@pytest.mark.timeout(120)
def test_a_worker_added_later_starts_with_the_rank_it_gets(tmp_path):
    """horovodrun starts a worker it adds with its planned place in the new world, so
    HOROVOD_RANK & co. before hvd.init() match hvd.rank() & co. after. Workers 0 (localhost) and
    1 (127.0.0.1); then the script swaps 127.0.0.1 for 127.0.0.2: worker 1 leaves and worker 2
    joins as rank 1 of 2 (its id would say rank 2 of 3), cross rank 1 of 2 (host 2 of 2)."""
    marker = tmp_path / "swap"
    discover = tmp_path / "discover.sh"
    discover.write_text(f"if [ -e {marker} ]; then printf 'localhost:1\\n127.0.0.2:1\\n'; "
                        f"else printf 'localhost:1\\n127.0.0.1:1\\n'; fi\n")
    proc = lib.accordrun("--min-np", "1", "--host-discovery-script", f"sh {discover}",
                         "--discovery-interval", "0.2", "--grace-period", "2",
                         lib.PYTHON, JOINER, str(marker), timeout=100)
    assert proc.returncode == 0, proc.stderr[-4000:]
    envs = {e["id"]: e for e in (json.loads(line.split("ENV ", 1)[1]) for line in proc.stdout.splitlines()
                                 if "ENV {" in line)}
    assert sorted(envs) == [0, 1, 2], proc.stdout[-3000:]
    expected = {0: (0, 2, 0, 1, 0, 2), 1: (1, 2, 0, 1, 1, 2), 2: (1, 2, 0, 1, 1, 2)}
    for member, coords in expected.items():
        before, after = envs[member]["before"], envs[member]["after"]
        assert tuple(after[k] for k in _COORDS) == coords, (member, after)
        assert {k: before[v] for k, v in _COORDS.items()} == {k: str(after[k]) for k in _COORDS}, (member, before)
        assert (before["ACCORD_RANK"], before["RANK"], before["ACCORD_SIZE"], before["WORLD_SIZE"]) == \
            (str(coords[0]), str(coords[0]), "2", "2"), (member, before)
    assert envs[2]["before"]["GROUP_RANK"] == "1"  # the second host of the re-formed job
    assert "elastic: started worker 2 on 127.0.0.2 (rank 1 of 2 once admitted)" in proc.stderr
    done = {d["id"]: d for d in _done(proc.stdout)}
    assert {m: (d["rank"], d["size"]) for m, d in done.items()} == {0: (0, 2), 2: (1, 2)}, proc.stdout[-3000:]
