"""accordrun's elastic launcher, end to end, where the unit tests cannot reach: --gpus checked
against the hosts a discovery script prints only after an empty first run (exit 2, no worker
started, no traceback), and --output-filename folders padded for --max-np."""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

# no host on its first run, then this host with 2 slots
LATE_HOSTS = "if [ -f seen ]; then echo localhost:2; else touch seen; fi"


@pytest.mark.timeout(60)
def test_gpus_too_few_for_hosts_printed_after_an_empty_first_discovery_exit_2(tmp_path):
    proc = lib.accordrun("-np", "2", "--gpus", "0", "--host-discovery-script", LATE_HOSTS,
                         "--discovery-interval", "0.2", "--elastic-timeout", "30",
                         lib.PYTHON, "-c", "open('started', 'w').close()", timeout=50, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "printed no host; waiting" in proc.stderr  # the first run printed none: the job waited
    assert "accordrun: error: --gpus/--devices lists 1 device(s) but host localhost runs 2 workers\n" \
           "HINT: list at least 2 devices" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "started").exists()


@pytest.mark.timeout(60)
def test_elastic_rank_folders_are_padded_for_max_np(tmp_path):
    out = tmp_path / "out"
    proc = lib.accordrun("-np", "2", "--max-np", "12", "--host-discovery-script", "echo localhost:2",
                         "--output-filename", str(out), lib.PYTHON, "-c", "print('hi')", timeout=50,
                         cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["rank.00", "rank.01"]  # 12 workers at most: rank.11
    assert (out / "rank.01" / "stdout").read_text() == "hi\n"
