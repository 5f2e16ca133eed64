"""accordrun through the real CLI (`python -m accord.run`): jobs on localhost, output, env."""
import errno
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.stacks import wait_until

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

REPORT = lib.script("report.py")


@pytest.mark.timeout(30)
def test_two_ranks_prefixes_contract_and_line_handling():
    proc = lib.accordrun("-np", "2", lib.PYTHON, REPORT, "--flag", "value")
    assert proc.returncode == 0, proc.stderr
    reports = lib.env_reports(proc.stdout)
    assert sorted(reports) == [0, 1]
    ports = set()
    for rank, env in reports.items():
        assert env["argv"] == ["--flag", "value"]
        for name, value in [("ACCORD_SIZE", "2"), ("ACCORD_LOCAL_RANK", str(rank)), ("ACCORD_LOCAL_SIZE", "2"),
                            ("ACCORD_CROSS_RANK", "0"), ("ACCORD_CROSS_SIZE", "1"), ("ACCORD_HOSTNAME", "localhost"),
                            ("HOROVOD_RANK", str(rank)), ("HOROVOD_SIZE", "2"), ("RANK", str(rank)),
                            ("WORLD_SIZE", "2"), ("LOCAL_RANK", str(rank)), ("LOCAL_WORLD_SIZE", "2"),
                            ("GROUP_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")]:
            assert env[name] == value, name
        assert env["secret_len"] == 64  # 32 bytes, hex
        ports.add((env["MASTER_PORT"], env["ACCORD_STORE_PORT"]))
    assert len(ports) == 1  # one job: the same ports for every rank
    master, store = ports.pop()
    assert store is None or store != master  # torch's TCPStore and accord's store differ
    for rank in (0, 1):
        for expected in (f"[{rank}]<stdout>:progress 1/2", f"[{rank}]<stdout>:progress 2/2",
                         f"[{rank}]<stdout>:snow \u2603", f"[{rank}]<stdout>:last line of {rank} without newline"):
            assert expected + "\n" in proc.stdout
        assert f"[{rank}]<stderr>:to stderr from {rank}\n" in proc.stderr
    assert "\r" not in proc.stdout


@pytest.mark.timeout(30)
def test_four_ranks_per_rank_files_filter_and_timestamps(tmp_path):
    out_dir = tmp_path / "logs"
    proc = lib.accordrun("-np", "4", "-H", "localhost:4", "--output-filename", str(out_dir), "--ranks-filter",
                         "1,3", "--prefix-timestamp", lib.PYTHON, REPORT)
    assert proc.returncode == 0, proc.stderr
    assert sorted(lib.env_reports(proc.stdout)) == [1, 3]  # the console shows only the filter
    lines = [line for line in proc.stdout.splitlines() if line]
    assert all(line[:2] == "20" and " [" in line for line in lines)  # "2026-... [1]<stdout>:"
    for rank in range(4):  # files keep every rank, raw (no prefixes)
        stdout = (out_dir / f"rank.{rank}" / "stdout").read_bytes().decode()
        stderr = (out_dir / f"rank.{rank}" / "stderr").read_text()
        assert stdout.startswith("ENV {") and f'"ACCORD_RANK": "{rank}"' in stdout
        assert "progress 1/2\rprogress 2/2\r\n" in stdout and stdout.endswith(f"last line of {rank} without newline")
        assert stderr == f"to stderr from {rank}\n"
    reports = {r: lib.env_reports((out_dir / f"rank.{r}" / "stdout").read_text().splitlines()[0])[r]
               for r in range(4)}
    assert [reports[r]["ACCORD_LOCAL_RANK"] for r in range(4)] == ["0", "1", "2", "3"]
    assert {reports[r]["ACCORD_LOCAL_SIZE"] for r in range(4)} == {"4"}


@pytest.mark.timeout(30)
def test_no_prefix_and_tuning_flags_reach_workers():
    proc = lib.accordrun("-np", "1", "--no-prefix", "--fusion-threshold-mb", "2", "--cycle-time-ms", "3.5",
                         "--hierarchical-allreduce", "--log-level", "debug", lib.PYTHON, REPORT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ENV {")
    env = lib.env_reports(proc.stdout)[0]
    assert env["ACCORD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024) and env["ACCORD_CYCLE_TIME"] == "3.5"
    assert env["ACCORD_HIERARCHICAL_ALLREDUCE"] == "1" and env["ACCORD_LOG_LEVEL"] == "debug"


@pytest.mark.timeout(30)
def test_a_horovodrun_command_line_runs_with_only_the_launcher_renamed():
    proc = lib.accordrun("--gloo", "--tcp", "--disable-cache", "--autotune", "-np", "1", "--cache-capacity", "64",
                         "--timeline-mark-cycles", "--gloo-timeout-seconds", "45", "--no-hierarchical-allreduce",
                         "--log-level", "WARNING", lib.PYTHON, REPORT)
    assert proc.returncode == 0, proc.stderr
    env = lib.env_reports(proc.stdout)[0]
    assert (env["ACCORD_CACHE_CAPACITY"], env["ACCORD_TIMELINE_MARK_CYCLES"], env["ACCORD_COLLECTIVE_TIMEOUT"],
            env["ACCORD_HIERARCHICAL_ALLREDUCE"], env["NCCL_IB_DISABLE"]) == ("64", "1", "45", "0", "1")
    assert proc.stderr.count("accordrun: warning: horovodrun's --autotune has no effect") == 1


@pytest.mark.timeout(30)
def test_omp_threads_default_is_said_once_and_explicit_setting_wins():
    cores = os.cpu_count() or 1
    proc = lib.accordrun("-np", "2", lib.PYTHON, REPORT, env=lib.cli_env(OMP_NUM_THREADS=None))
    assert proc.returncode == 0, proc.stderr
    expected = str(max(1, cores // 2))
    assert {e["OMP_NUM_THREADS"] for e in lib.env_reports(proc.stdout).values()} == {expected}
    assert proc.stderr.count("OMP_NUM_THREADS is not set") == 1
    proc = lib.accordrun("-np", "2", lib.PYTHON, REPORT, env=lib.cli_env(OMP_NUM_THREADS="3"))
    assert {e["OMP_NUM_THREADS"] for e in lib.env_reports(proc.stdout).values()} == {"3"}
    assert "OMP_NUM_THREADS is not set" not in proc.stderr


@pytest.mark.timeout(30)
def test_master_port_is_held_for_the_job_and_rank_0_can_serve_on_it():
    # Between the launcher picking MASTER_PORT and rank 0 binding it, the OS must not hand the
    # port to anyone else (another job's store did, once): the launcher keeps it bound.
    proc = lib.accordrun("-np", "2", lib.PYTHON, lib.script("master_port_state.py"))
    assert proc.returncode == 0, proc.stderr
    seen = {}
    for line in proc.stdout.splitlines():
        if "MASTER " in line:
            data = json.loads(line.split("MASTER ", 1)[1])
            seen[data["rank"]] = data
    assert sorted(seen) == [0, 1]
    assert {d["plain_error"] for d in seen.values()} == {errno.EADDRINUSE}
    assert seen[0]["served"] == seen[0]["port"] == seen[1]["port"]


@pytest.mark.timeout(30)
def test_explicit_master_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = lib.accordrun("-np", "2", "--master-port", str(port), lib.PYTHON, REPORT)
    assert proc.returncode == 1
    assert f"port {port} (--master-port) is already in use" in proc.stderr and "HINT:" in proc.stderr
    assert "ENV" not in proc.stdout  # nothing started


@pytest.mark.timeout(30)
def test_explicit_store_port_in_use_is_a_clear_error():
    pytest.importorskip("accord.store.server")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = lib.accordrun("-np", "2", "--store-port", str(port), lib.PYTHON, REPORT)
    assert proc.returncode == 1
    assert f"127.0.0.1:{port} (--store-port)" in proc.stderr and "HINT:" in proc.stderr
    assert "ENV" not in proc.stdout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, fragment", [
    (["-np", "3", "-H", "localhost:2", "python3", "x"], "more than the 2 slots"),
    (["--unknown-flag", "-np", "2", "python3"], "unrecognized arguments"),
    (["-H", "localhost:0", "python3"], "0 slots"),
])
def test_bad_arguments_exit_2_with_hint_and_start_nothing(argv, fragment, tmp_path):
    proc = lib.accordrun(*argv, "--output-filename", str(tmp_path / "o")) if argv[0] != "--unknown-flag" \
        else lib.accordrun(*argv)
    assert proc.returncode == 2
    assert fragment in proc.stderr and "HINT:" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(30)
def test_launcher_does_not_import_torch():
    proc = subprocess.run([lib.PYTHON, "-X", "importtime", "-m", "accord.run", "--version"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and "accordrun (accord)" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "accord.run.cli" in imported and not any(m.split(".")[0] == "torch" for m in imported)
    # every module the launcher and spawn use, imported together
    code = ("import sys, accord, accord.run.cli, accord.run.launcher, accord.run.functions.spawn, "
            "accord.run.processes.job_store, accord.store.server, accord.store.connection; "
            "accord.spawn; print('torch' in sys.modules)")
    check = subprocess.run([lib.PYTHON, "-c", code], capture_output=True, text=True, timeout=20)
    assert check.stdout.strip() == "False", check.stderr


@pytest.mark.timeout(60)
def test_check_build_lists_frameworks_and_backends():
    proc = lib.accordrun("--check-build", timeout=50)
    assert proc.returncode == 0, proc.stderr
    import torch

    assert "[X] PyTorch" in proc.stdout and torch.__version__ in proc.stdout
    assert "[X] Gloo" in proc.stdout
    for name in ("NCCL", "MPI", "CUDA", "MXNet"):
        assert name in proc.stdout


@pytest.mark.timeout(60)
def test_a_signal_during_the_launch_copy_stops_it_and_starts_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    copying = tmp_path / "rsync-started"
    (bin_dir / "rsync").write_text(f"#!/bin/sh\ntouch {copying}\nexec sleep 120\n")
    (bin_dir / "rsync").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-m", "accord.run", "-np", "1", "--sync-dst-dir",
                             str(tmp_path / "copy"), sys.executable, "-c", "print('WORKER RAN')"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the launcher is in the copy once the fake rsync (which sleeps 2 minutes) has started
        assert wait_until(lambda: copying.exists() or proc.poll() is not None, timeout=30), "no copy started"
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGINT)
        # the copy was stopped, not waited for: 30 s is a quarter of the fake rsync's sleep
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert "accordrun: received SIGINT while copying --sync-dst-dir; nothing was started" in err
    assert "WORKER RAN" not in out


@pytest.mark.timeout(30)
def test_a_link_planted_in_the_output_folder_is_refused_before_anything_starts(tmp_path):
    """Another user who can write to the output folder links rank.1/stdout to a file of the
    user running the job: the job must not overwrite it, nor start rank 1 (rank 0, started
    first, is stopped)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out_dir = tmp_path / "shared"
    (out_dir / "rank.1").mkdir(parents=True)
    (out_dir / "rank.1" / "stdout").symlink_to(victim)
    started = tmp_path / "started"
    started.mkdir()
    proc = lib.accordrun("-np", "2", "--output-filename", str(out_dir), lib.PYTHON, "-c",
                         f"import os; open(os.path.join({str(started)!r}, os.environ['ACCORD_RANK']), 'w')",
                         timeout=25)
    assert victim.read_text() == "precious\n"
    assert proc.returncode == 2, proc.stderr
    assert f"--output-filename: {out_dir / 'rank.1' / 'stdout'} is a symbolic link" in proc.stderr
    assert "HINT:" in proc.stderr
    assert "1" not in os.listdir(started)  # rank 1 never started
