"""Bad command-line input to accordrun (and accord-mxnet-launch) found by an audit of every flag:
each case exits 2 with a HINT, starts nothing, and never raises a traceback, hangs or fills the
memory. Also the elastic launcher's --gpus check when the first discovery printed no host, the
padding of an elastic job's --output-filename folders, and the checks of slot counts,
--fusion-threshold-mb, --timeline-filename, the --autotune-* values and --master-addr."""
from __future__ import annotations

import os
import sys

import pytest

from accord.errors import ConfigError
from accord.run import mxnet_launch
from accord.run.cli import build_parser, main
from accord.run.config import timeline_path
from accord.run.config.launch_config import config_from_args
from accord.run.elastic import driver as elastic_driver
from accord.run.elastic.config import ElasticConfig
from accord.run.elastic.discovery import DiscoveryError, DiscoveryResult, parse_discovery_output
from accord.run.spec.assignment import MAX_WORKERS
from accord.run.spec.tuning import tuning_env
from tests.helpers.elastic_fakes import FakePoller, FakeStore, FakeSupervisor

pytestmark = pytest.mark.timeout(60)

ENV = {"PATH": "/usr/bin:/bin"}
# what main() runs where a case is accepted by mistake: ends at once, reads no stdin
HARMLESS = [sys.executable, "-c", "pass"]
TOO_MANY = str(MAX_WORKERS + 1)  # small enough that building that many slots without the check is quick


def _cfg(*argv, cwd="/work"):
    return config_from_args(build_parser().parse_args(list(argv)), ENV, cwd=cwd)


def _refused(capsys, argv, fragment):
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("accordrun: error:") and fragment in err and "HINT:" in err, err


# --- counts, files, paths and empty values refused by the command line ---------------------------

@pytest.mark.parametrize("argv, fragment", [
    (["-np", TOO_MANY, "python3"], f"is {TOO_MANY}, more than the {MAX_WORKERS} accordrun starts"),
    (["-H", f"localhost:{TOO_MANY}", "python3"], f"is {TOO_MANY}, more than"),  # -np: every slot
    (["-np", "2", "--num-servers", TOO_MANY, "python3"], f"--num-servers is {TOO_MANY}"),
    (["-np", "2", "--master-addr", "", "python3"], "--master-addr is empty"),
    (["-np", "2", "--network-interface", " ", "python3"], "--network-interface is empty"),
    (["-np", "2", "--output-filename", "", "python3"], "--output-filename is empty"),
    (["-np", "2", "--timeline-filename", "", "python3"], "--timeline-filename is empty"),
    (["-H", "localhost:2", "--nproc-per-node", "2", "python3"], "cannot be used with -H/--hosts"),
    (["--host-discovery-script", "echo localhost:2", "--nproc-per-node", "2", "python3"],
     "cannot be used with --host-discovery-script"),
    (["-np", "4", "--nproc-per-node", "2", "python3"], "-np 4 is more than the 2 slots"),
    (["-np", "2", "--elastic-timeout", "5", "python3"], "--elastic-timeout needs --host-discovery-script"),
    (["-np", "2", "--elastic-timeout", "-1", "python3"], "--elastic-timeout needs --host-discovery-script"),
])
def test_bad_values_are_refused_with_a_hint(argv, fragment):
    with pytest.raises(ConfigError) as info:
        _cfg(*argv)
    assert fragment in str(info.value) and "\nHINT: " in str(info.value)


def test_nproc_per_node_alone_is_this_hosts_slots():
    assert _cfg("--nproc-per-node", "3", "python3").num_proc == 3
    assert _cfg("-np", "2", "--nproc-per-node", "3", "python3").num_proc == 2  # as -H localhost:3


@pytest.mark.parametrize("name, fragment", [
    ("missing.sh", "does not exist"),
    ("folder", "is a folder"),
    ("plain.sh", "is not executable"),
])
def test_a_command_given_by_path_must_be_an_executable_file(tmp_path, name, fragment):
    (tmp_path / "folder").mkdir()
    (tmp_path / "plain.sh").write_text("echo hi\n")
    with pytest.raises(ConfigError, match=f"(?s)command '.*{name}' {fragment}.*HINT"):
        _cfg("-np", "2", str(tmp_path / name))
    with pytest.raises(ConfigError, match=fragment):  # a relative path: from the launcher's folder
        _cfg("-np", "2", f"./{name}", cwd=str(tmp_path))


def test_a_command_path_is_not_checked_where_it_runs_from_a_sync_copy(tmp_path):
    cfg = _cfg("-np", "2", "--sync-dst-dir", str(tmp_path / "copy"), "./train.sh", cwd=str(tmp_path))
    assert cfg.command == ("./train.sh",)


def test_an_undecodable_hostfile_or_config_file(tmp_path, capsys):
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00node1 slots=2\n")
    _refused(capsys, ["--hostfile", str(binary), *HARMLESS], "is not UTF-8 text")
    _refused(capsys, ["-np", "1", "--config-file", str(binary), *HARMLESS], "is not UTF-8 text")
    assert mxnet_launch.main(["-n", "2", "-H", str(binary), *HARMLESS]) == 2
    err = capsys.readouterr().err
    assert "-H/--hostfile" in err and "HINT:" in err


def test_a_hostfile_that_is_a_device_a_fifo_or_too_large_is_refused_at_once(tmp_path, capsys):
    """/dev/zero was read whole (a MemoryError traceback), a FIFO without a writer hung."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_text("node1 slots=1\n" * 80_000)  # > 1 MiB
    for path, fragment in (("/dev/zero", "'/dev/zero' is a device, not a regular file"),
                           (str(fifo), "is a FIFO, not a regular file"),
                           (str(tmp_path), "is a folder, not a regular file"),
                           (str(big), "is larger than 1048576 bytes")):
        _refused(capsys, ["--hostfile", path, *HARMLESS], fragment)
        assert mxnet_launch.main(["-n", "2", "-H", path, *HARMLESS]) == 2
        err = capsys.readouterr().err
        assert fragment in err and "HINT:" in err, err


@pytest.mark.parametrize("value", ["1e308", "3601", "-1"])
def test_a_grace_period_outside_0_to_an_hour_is_refused(value, capsys):
    _refused(capsys, ["-np", "1", "--grace-period", value, *HARMLESS], "--grace-period must be")


def test_grace_periods_up_to_an_hour_are_accepted():
    assert _cfg("-np", "1", "--grace-period", "3600", "python3").grace_period == 3600.0
    assert _cfg("-np", "1", "--grace-period", "0", "python3").grace_period == 0.0


def test_spawns_grace_period_is_bounded_too():
    from accord.run.functions.spawn import _split_options

    with pytest.raises(ConfigError, match="(?s)accord.spawn's grace_period must be at most 3600.*HINT"):
        _split_options({"grace_period": 1e308})


@pytest.mark.parametrize("folder", ["/tmp/a\nb", "/tmp/tab\there", "/tmp/cr\r"])
def test_a_sync_dst_dir_with_a_control_character_is_refused(folder, capsys):
    """rsync's remote shell ended the path at the newline: the copy went elsewhere and the
    workers, started in the folder, exited 127."""
    _refused(capsys, ["-np", "1", "--sync-dst-dir", folder, *HARMLESS], "contains control characters")


def test_an_empty_config_file_path_is_refused(capsys):
    _refused(capsys, ["-np", "1", "--config-file", "", *HARMLESS], "--config-file '' cannot be read")


@pytest.mark.parametrize("text, fragment", [
    ("params:\n  cache_capacity: 1.5\n", "params.cache_capacity must be a whole number, got 1.5"),
    ("params:\n  cache_capacity: true\n", "params.cache_capacity must be a whole number, got True"),
    ("params:\n  cycle_time_ms: true\n", "params.cycle_time_ms must be a number, got True"),
])
def test_config_file_numbers_are_not_quietly_truncated(tmp_path, capsys, text, fragment):
    pytest.importorskip("yaml")
    path = tmp_path / "hvd.yaml"
    path.write_text(text)
    _refused(capsys, ["-np", "1", "--config-file", str(path), *HARMLESS], fragment)


def test_an_output_folder_that_cannot_be_made_exits_2_before_anything_starts(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for path in (a_file, a_file / "below"):
        _refused(capsys, ["-np", "1", "--output-filename", str(path), *HARMLESS], "cannot be created as a folder")
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


def test_a_discovered_host_with_too_many_slots_is_a_discovery_error():
    with pytest.raises(DiscoveryError, match=f"slots must be a positive integer \\(at most {MAX_WORKERS}\\)"):
        parse_discovery_output(f"h1:{TOO_MANY}\n", None, "d.sh")


def test_mxnet_launch_refuses_a_huge_worker_count_and_a_bad_env_name(tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode2\n")
    ns = mxnet_launch.build_parser().parse_args(["-n", TOO_MANY, "-H", str(hosts), "python3"])
    with pytest.raises(ValueError, match=f"(?s)-n/--num-workers is {TOO_MANY}.*HINT"):
        mxnet_launch.accordrun_argv(ns, True)  # not main(): it would run what it accepted
    assert mxnet_launch.main(["-n", "1", "--env", "A B:1", *HARMLESS]) == 2
    err = capsys.readouterr().err
    assert "--env 'A B:1' is not NAME:VALUE" in err and "HINT:" in err


# --- elastic: --gpus when the first discovery printed no host, and rank folder padding -----------

class _Member:
    def __init__(self, index, host):
        self.index, self.host, self.returncode, self.stopped, self.kind = index, host, None, False, "worker"


def _driver(tmp_path, *argv):
    """An elastic driver over fakes; returns it, the (id, host, joining) started and what it said."""
    cfg = _cfg(*argv, "python3", "t.py", cwd=str(tmp_path))
    started, said = [], []

    def start(i, slot, joining):
        started.append((i, slot.hostname, joining))
        return _Member(i, slot.hostname)

    elastic = ElasticConfig(cfg.elastic.discovery_script, start_np=cfg.elastic.start_np,
                            elastic_timeout=30.0, discovery_interval=0.5)
    driver = elastic_driver.ElasticDriver(cfg, elastic, FakeSupervisor(), FakeStore(), start, lambda m: m,
                                          said.append, clock=lambda: 1.0)
    driver._poller = FakePoller()
    driver.start()
    return driver, started, said


def _discover(driver, text):
    driver._poller.queue.append(DiscoveryResult(parse_discovery_output(text, None, "d.sh"), None, 1.0))


def test_gpus_are_checked_when_hosts_come_after_an_empty_first_discovery(tmp_path):
    """The command line cannot check --gpus against hosts not printed yet: the driver does,
    once they are, before it starts any worker (the launcher then exits 2)."""
    driver, started, said = _driver(tmp_path, "-np", "2", "--gpus", "0", "--host-discovery-script", "true")
    assert started == [] and "printed no host" in said[0]
    _discover(driver, "h1:2\n")
    with pytest.raises(ConfigError) as info:
        driver.poll()
    assert str(info.value).splitlines() == [
        "--gpus/--devices lists 1 device(s) but host h1 runs 2 workers",
        "HINT: list at least 2 devices, or lower the workers per host"]
    assert started == []


def test_gpus_that_fit_the_first_hosts_start_the_job_after_the_wait(tmp_path):
    driver, started, said = _driver(tmp_path, "-np", "2", "--gpus", "0", "--host-discovery-script", "true")
    _discover(driver, "h1:1\nh2:1\n")
    assert not driver.poll() and started == [(0, "h1", False), (1, "h2", False)]


def test_a_host_that_grows_past_the_gpus_gets_one_worker_per_device(tmp_path):
    """Later, the job runs: a host with more slots than devices is used up to them (said once),
    where a worker without a device could not be started."""
    driver, started, said = _driver(tmp_path, "-np", "1", "--gpus", "0", "--host-discovery-script", "echo h1:1")
    assert started == [(0, "h1", False)]
    for _ in range(2):
        _discover(driver, "h1:2\nh2:3\n")
        assert not driver.poll()
    assert started == [(0, "h1", False), (1, "h2", True)]
    assert [line.splitlines()[0] for line in said if "warning" in line] == [
        "warning: h1 has 2 slots but --gpus/--devices lists 1 device(s): using 1 of them",
        "warning: h2 has 3 slots but --gpus/--devices lists 1 device(s): using 1 of them"]


@pytest.mark.parametrize("argv, size", [
    (["-np", "4"], 4),
    (["-np", "2", "--max-np", "12", "--host-discovery-script", "echo localhost:2"], 12),
    (["-np", "2", "--host-discovery-script", "echo localhost:3"], 3),  # no --max-np: the first workers
    (["-np", "5", "--host-discovery-script", "true"], 5),  # waiting for -np slots
    (["-np", "2", "--min-np", "1", "-H", "a:2,b:2"], 4),  # fixed hosts: every slot
])
def test_rank_folders_are_padded_for_the_most_workers_the_job_may_have(argv, size):
    assert _cfg(*argv, "python3").rank_dir_size == size


# --- slot counts, fusion threshold, timeline path, autotune values, --master-addr ----------------

@pytest.mark.parametrize("hosts", ["a:+2", "a: 2", "a:1_0", "a:\u0662", "a:2,b:+1"])
def test_a_slot_count_must_be_plain_digits(hosts):
    """int() takes a sign, spaces, underscores and other scripts' digits; a slot count does not."""
    with pytest.raises(ConfigError, match="(?s)must be an integer in plain digits.*HINT"):
        _cfg("-H", hosts, "python3")


@pytest.mark.parametrize("line", ["a slots=+2", "a slots=1_0", "a slots=2 max_slots=+4", "a:+2"])
def test_a_hostfile_slot_count_must_be_plain_digits(tmp_path, line):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{line}\n")
    with pytest.raises(ConfigError, match="(?s)hosts:1: slots for 'a' must be an integer in plain digits.*HINT"):
        _cfg("--hostfile", str(hostfile), "python3")


def test_plain_slot_counts_still_work(tmp_path):
    assert [(h.hostname, h.slots) for h in _cfg("-H", "a:2,b", "python3").hosts] == [("a", 2), ("b", 1)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2 max_slots=4\nb:3\n")
    assert [(h.hostname, h.slots) for h in _cfg("--hostfile", str(hostfile), "python3").hosts] == [("a", 2), ("b", 3)]


@pytest.mark.parametrize("value", ["1048577", "1e300", "9.3e12"])
def test_a_fusion_threshold_above_1_tib_is_refused(value):
    with pytest.raises(ConfigError, match="(?s)--fusion-threshold-mb must be at most 1048576: that is 1 TiB.*HINT"):
        _cfg("-np", "1", "--fusion-threshold-mb", value, "python3")


def test_a_fusion_threshold_in_the_config_file_has_the_same_bound(tmp_path, capsys):
    pytest.importorskip("yaml")
    path = tmp_path / "hvd.yaml"
    path.write_text("params:\n  fusion_threshold_mb: 1e+30\n")
    _refused(capsys, ["-np", "1", "--config-file", str(path), *HARMLESS], "must be at most 1048576")


def test_a_negative_fusion_threshold_was_already_refused():
    """Not new: the tuning table's ">=0" minimum refuses it (kept here as the proof)."""
    with pytest.raises(ConfigError, match="(?s)--fusion-threshold-mb must be >= 0, got -1.*HINT"):
        _cfg("-np", "1", "--fusion-threshold-mb", "-1", "python3")


def test_fusion_thresholds_up_to_the_bound_still_work():
    for value, variable in (("64", str(64 << 20)), ("0", "0"), ("0.5", str(1 << 19)), ("1048576", str(1 << 40))):
        assert tuning_env(_cfg("-np", "1", "--fusion-threshold-mb", value, "python3").tuning)[
            "ACCORD_FUSION_THRESHOLD"] == variable


def test_a_timeline_path_that_is_a_folder_or_below_a_file_is_refused_when_rank_0_is_here(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    _refused(capsys, ["-np", "1", "--timeline-filename", str(tmp_path), *HARMLESS], "is a folder on this host")
    for path in (a_file / "tl.json", a_file / "below" / "tl.json"):
        _refused(capsys, ["-np", "1", "--timeline-filename", str(path), *HARMLESS],
                 f"{str(a_file)!r} is a file on this host")
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


def test_a_missing_timeline_folder_is_only_a_warning_where_rank_0_is_here(tmp_path, monkeypatch, capsys):
    """The program may create the folder before hvd.init(): said, not refused."""
    monkeypatch.setattr("accord.run.launcher.launch", lambda cfg: 0)
    assert main(["-np", "1", "--timeline-filename", str(tmp_path / "new" / "tl.json"), "python3"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("accordrun: warning: --timeline-filename") and "does not exist on this host" in err
    assert main(["-np", "1", "--timeline-filename", str(tmp_path / "tl.json"), "python3"]) == 0  # a folder that exists
    assert capsys.readouterr().err == ""


def test_a_timeline_path_is_not_checked_where_rank_0_is_remote(tmp_path):
    """This host's files say nothing of rank 0's host: a missing folder, or one that is a folder
    here, is neither refused nor warned about."""
    for path in (tmp_path / "missing" / "tl.json", tmp_path):
        cfg = _cfg("-H", "rank0-elsewhere:1,localhost:1", "--timeline-filename", str(path), "python3")
        assert timeline_path.check(cfg) == []


def test_timeline_filename_dynamic_is_horovods_keyword_not_a_file(tmp_path, monkeypatch, capsys):
    """horovodrun --timeline-filename DYNAMIC hands the keyword to the workers (no file until
    hvd.start_timeline); it is neither made absolute nor checked as a path."""
    monkeypatch.chdir(tmp_path)
    cfg = _cfg("-np", "1", "--timeline-filename", "DYNAMIC", "python3", cwd=str(tmp_path))
    assert tuning_env(cfg.tuning)["ACCORD_TIMELINE"] == "DYNAMIC"
    assert timeline_path.check(cfg) == []
    monkeypatch.setattr("accord.run.launcher.launch", lambda cfg: 0)
    assert main(["-np", "1", "--timeline-filename", "DYNAMIC", "python3"]) == 0
    assert capsys.readouterr().err == ""
    # a relative file name is still made absolute (workers may start in another folder)
    rel = _cfg("-np", "1", "--timeline-filename", "tl.json", "python3", cwd=str(tmp_path))
    assert tuning_env(rel.tuning)["ACCORD_TIMELINE"] == os.path.join(str(tmp_path), "tl.json")


@pytest.mark.parametrize("flag, value, fragment", [
    ("--autotune-warmup-samples", "0", "must be a whole number >= 1"),
    ("--autotune-warmup-samples", "-2", "must be a whole number >= 1"),
    ("--autotune-steps-per-sample", "+3", "must be a whole number >= 1"),
    ("--autotune-bayes-opt-max-samples", "three", "must be a whole number >= 1"),
    ("--autotune-gaussian-process-noise", "-0.1", "must be a finite number >= 0"),
    ("--autotune-gaussian-process-noise", "nan", "must be a finite number >= 0"),
    ("--autotune-gaussian-process-noise", "x", "must be a finite number >= 0"),
])
def test_autotune_values_no_autotuner_could_use_are_refused(capsys, flag, value, fragment):
    _refused(capsys, ["-np", "1", f"{flag}={value}", *HARMLESS], f"{flag} {fragment}")


@pytest.mark.parametrize("key, value, fragment", [
    ("warmup_samples", "0", "must be a whole number >= 1"),
    ("steps_per_sample", "-1", "must be a whole number >= 1"),
    ("bayes_opt_max_samples", "0", "must be a whole number >= 1"),
    ("gaussian_process_noise", "-1.5", "must be a finite number >= 0"),
    ("gaussian_process_noise", ".nan", "must be a finite number >= 0"),
])
def test_autotune_values_in_the_config_file_are_refused(tmp_path, capsys, key, value, fragment):
    pytest.importorskip("yaml")
    path = tmp_path / "hvd.yaml"
    path.write_text(f"autotune:\n  {key}: {value}\n")
    _refused(capsys, ["-np", "1", "--config-file", str(path), *HARMLESS], f"--config-file: autotune.{key} {fragment}")


def test_usable_autotune_values_are_still_accepted_and_ignored(monkeypatch, capsys):
    monkeypatch.setattr("accord.run.launcher.launch", lambda cfg: 0)
    assert main(["-np", "1", "--autotune", "--autotune-warmup-samples", "3", "--autotune-steps-per-sample", "10",
                 "--autotune-bayes-opt-max-samples", "20", "--autotune-gaussian-process-noise", "0", "python3"]) == 0
    assert "ignored" in capsys.readouterr().err


@pytest.mark.parametrize("value, fragment", [
    ("node 1", "contains whitespace"),
    ("node1\t", "contains whitespace"),
    ("tcp://node1:29500", "is a URL"),
    ("node1:29500", "has a port (29500)"),
    ("10.0.0.1:29500", "has a port (29500)"),
    ("[fe80::1]:29500", "has a port (29500)"),
    ("node1/train", "is not a host name or IP address"),
])
def test_a_master_addr_that_no_host_has_is_refused(value, fragment):
    with pytest.raises(ConfigError) as info:
        _cfg("-np", "1", "--master-addr", value, "python3")
    assert f"--master-addr {value!r} {fragment}" in str(info.value) and "\nHINT: " in str(info.value)


def test_a_master_addr_with_a_port_or_scheme_points_to_master_port():
    for value in ("node1:29500", "tcp://node1:29500"):
        with pytest.raises(ConfigError, match="HINT: .*--master-addr node1 --master-port 29500"):
            _cfg("-np", "1", "--master-addr", value, "python3")


@pytest.mark.parametrize("value", ["node1", "node1.example.com", "10.0.0.5", "fe80::1", "[fe80::1]", "my_host-2"])
def test_host_names_and_addresses_are_still_master_addrs(value):
    assert _cfg("-np", "1", "--master-addr", value, "python3").master_addr == value


@pytest.mark.parametrize("flag", ["-np", "--nproc-per-node", "--store-port", "--master-port", "--ssh-port",
                                  "--min-np", "--max-np", "--slots-per-host", "--reset-limit"])
@pytest.mark.parametrize("value", ["+2", " 2", "1_0", "٢"])
def test_counts_and_ports_must_be_plain_digits(capsys, flag, value):
    """int() takes these; a typo like -np 1_0 would start 10 workers. (argparse exits itself.)"""
    with pytest.raises(SystemExit) as exited:
        main([flag, value, *HARMLESS])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("accordrun: error: argument ") and flag in err, err
    assert f"must be a whole number in plain digits, got {value!r}" in err and "HINT:" in err, err


def test_mxnet_launch_counts_must_be_plain_digits(capsys):
    with pytest.raises(SystemExit) as exited:
        mxnet_launch.main(["-n", "1_0", *HARMLESS])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "must be a whole number in plain digits, got '1_0'" in err and "HINT:" in err, err
