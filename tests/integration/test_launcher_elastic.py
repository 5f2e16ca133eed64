"""accordrun --min-np: an elastic job (hvd.elastic.run) carries on without a worker that dies,
while enough remain; below --min-np the first failure stops the job as usual."""
import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

TRAIN = lib.script("elastic_train.py")


def _done(stdout):
    return [json.loads(line.split("DONE ", 1)[1]) for line in stdout.splitlines() if "DONE {" in line]


@pytest.mark.timeout(90)
def test_min_np_job_finishes_on_the_survivors():
    proc = lib.accordrun("-np", "3", "--min-np", "2", lib.PYTHON, TRAIN, "--steps", "5",
                         "--die-rank", "2", "--die-step", "2", timeout=80)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = _done(proc.stdout)
    assert sorted(d["first_rank"] for d in done) == [0, 1]
    for d in done:
        assert d["size"] == 2
        assert d["sizes"] == [3, 3, 2, 2, 2]  # two committed steps on 3 ranks, then 2
    assert done[0]["weight"] == done[1]["weight"]  # the survivors still agree
    assert "elastic: rank 2 on localhost ended (exit code 3); continuing with 2 workers (--min-np 2)" in proc.stderr
    assert "elastic: the job finished on ranks [0, 1] (--min-np 2) without rank 2" in proc.stderr


@pytest.mark.timeout(60)
def test_below_min_np_the_failure_stops_the_job():
    proc = lib.accordrun("-np", "2", "--min-np", "2", lib.PYTHON, TRAIN, "--steps", "50",
                         "--die-rank", "1", "--die-step", "1", timeout=50)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "rank 1" in proc.stderr and "exit code 3" in proc.stderr
    assert not _done(proc.stdout)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, fragment", [
    (["-np", "2", "--min-np", "3"], "--min-np must be between 1 and -np (2)"),
    (["-np", "2", "--min-np", "0"], "--min-np must be between 1 and -np (2)"),
    (["-np", "3", "--max-np", "2"], "--max-np 2 is below -np 3"),
    (["-np", "2", "--host-discovery-script", "./discover.sh"], "--host-discovery-script is not supported"),
])
def test_bad_elastic_flags_exit_2_with_hint(argv, fragment):
    proc = lib.accordrun(*argv, lib.PYTHON, TRAIN)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "HINT:" in proc.stderr
    assert not _done(proc.stdout)
