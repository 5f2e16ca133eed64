"""`accordrun --num-servers` without starting processes: flag validation, the workers' and servers'
environment (MXNet's DMLC_* names), PS_VERBOSE levels, `[serverN]` output, server failures."""
import io
import os

import pytest

from accord import config
from accord.errors import ConfigError, LaunchError
from accord.run.cli import build_parser, main
from accord.run.config.launch_config import config_from_args
from accord.run.processes.failures import Failure, format_root_cause, pick_root_cause
from accord.run.processes.output import OutputMux, format_line
from accord.run.spec.server_roles import ps_env, server_dirname, server_env, server_label
from accord.run.spec.tuning import Tuning, tuning_env
from accord.run.spec.worker_env import JobEnv, forwarded_env
from accord.worker_contract import SERVER_MODULE, server_command

ENV = {"PATH": "/usr/bin:/bin"}
JOB = JobEnv(job_id="j1", master_addr="127.0.0.1", master_port=29500, store_addr="10.0.0.1", store_port=4000)


def _cfg(*argv, environ=ENV):
    return config_from_args(build_parser().parse_args(list(argv)), environ, cwd="/work")


# --- the flag ----------------------------------------------------------------------------------

def test_num_servers_default_zero_and_counts_separately_from_workers():
    assert _cfg("-np", "2", "python3").num_servers == 0
    cfg = _cfg("-np", "4", "--num-servers", "2", "python3", "train.py")
    assert cfg.num_servers == 2 and cfg.num_proc == 4 and len(cfg.slots) == 4  # -np counts workers
    assert _cfg("-np", "1", "--num-servers", " 0 ", "python3").num_servers == 0


@pytest.mark.parametrize("value", ["-1", "two", "1.5", ""])
def test_bad_num_servers_is_a_config_error_with_hint(value):
    with pytest.raises(ConfigError) as info:
        _cfg("-np", "2", "--num-servers", value, "python3")
    text = str(info.value)
    assert f"--num-servers must be a whole number >= 0, got {value!r}" in text and "HINT:" in text


def test_bad_num_servers_exits_2_through_main(capsys):
    assert main(["-np", "2", "--num-servers", "-3", "python3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accordrun: error:") and "--num-servers" in err and "HINT:" in err


# --- PS_VERBOSE levels ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, level", [("0", 0), ("1", 1), ("2", 2), ("true", 1), ("off", 0), ("", 0)])
def test_ps_verbose_is_a_level(text, level):
    assert config.get("ACCORD_VERBOSE", {"PS_VERBOSE": text}) == level


def test_ps_verbose_rejects_other_text():
    with pytest.raises(ConfigError) as info:
        config.get("ACCORD_VERBOSE", {"PS_VERBOSE": "loud"})
    assert "PS_VERBOSE='loud'" in str(info.value) and "HINT:" in str(info.value)


def test_ps_verbose_2_reaches_workers_and_servers_as_2():
    cfg = _cfg("-np", "1", "--num-servers", "1", "python3", environ={**ENV, "PS_VERBOSE": "2"})
    assert cfg.verbose is True and cfg.tuning.verbose == 2
    assert tuning_env(cfg.tuning)["ACCORD_VERBOSE"] == "2"
    cfg = _cfg("-np", "1", "--verbose", "python3")  # the flag alone is level 1
    assert cfg.verbose is True and tuning_env(cfg.tuning)["ACCORD_VERBOSE"] == "1"
    assert tuning_env(Tuning(verbose=True)) == {"ACCORD_VERBOSE": "1"}  # spawn(verbose=True)


# --- environments --------------------------------------------------------------------------------

def test_worker_ps_env_has_mxnet_and_accord_names():
    env = ps_env("worker", JOB, num_servers=2, num_workers=4)
    assert env == {
        "DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "4", "DMLC_NUM_SERVER": "2",
        "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "4000",
        "ACCORD_ROLE": "worker", "ACCORD_NUM_WORKERS": "4", "ACCORD_NUM_SERVERS": "2",
        "ACCORD_PS_ROOT_URI": "10.0.0.1", "ACCORD_PS_ROOT_PORT": "4000",
    }
    # a stale ACCORD_* value in the user's environment cannot win: ours are set too
    merged = {"ACCORD_PS_ROOT_PORT": "1", "ACCORD_NUM_SERVERS": "9", **env}
    assert config.get("ACCORD_PS_ROOT_PORT", merged) == 4000 and config.get("ACCORD_NUM_SERVERS", merged) == 2
    # and an MXNet script that only reads DMLC_* sees the same
    only_dmlc = {k: v for k, v in env.items() if k.startswith("DMLC_")}
    assert config.get("ACCORD_NUM_WORKERS", only_dmlc) == 4 and config.get("ACCORD_ROLE", only_dmlc) == "worker"


def test_server_env_index_store_role_and_tuning():
    env = server_env(1, JOB, 2, 3, tuning=Tuning(verbose=2, start_timeout=9))
    assert env["DMLC_ROLE"] == env["ACCORD_ROLE"] == "server"
    assert env["ACCORD_SERVER_INDEX"] == "1" and env["ACCORD_JOB_ID"] == "j1"
    assert env["ACCORD_STORE_ADDR"] == "10.0.0.1" and env["ACCORD_STORE_PORT"] == "4000"
    assert env["DMLC_NUM_WORKER"] == "3" and env["DMLC_NUM_SERVER"] == "2"
    assert env["ACCORD_VERBOSE"] == "2" and env["ACCORD_START_TIMEOUT"] == "9"
    assert "ACCORD_NODE_HOST" not in env and "ACCORD_JOB_SECRET" not in env
    for name, text in env.items():  # every value parses as the declared type
        if name in config.VARIABLES:
            config.get(name, {name: text})


def test_server_env_node_host_for_multi_host_unless_the_user_set_one():
    assert server_env(0, JOB, 1, 2, node_host="10.0.0.1")["ACCORD_NODE_HOST"] == "10.0.0.1"
    env = server_env(0, JOB, 1, 2, user_env={"DMLC_NODE_HOST": "10.9.9.9"}, node_host="10.0.0.1")
    assert "ACCORD_NODE_HOST" not in env  # the user's DMLC_NODE_HOST (inherited) applies


def test_ps_env_errors():
    with pytest.raises(LaunchError, match="HINT:"):
        ps_env("worker", JobEnv("j", "127.0.0.1", 1), 1, 1)  # no store
    with pytest.raises(LaunchError, match="unknown parameter-server role"):
        ps_env("scheduler", JOB, 1, 1)


def test_server_command_labels_and_dirs():
    assert server_command("/py") == ["/py", "-m", SERVER_MODULE] == ["/py", "-m", "accord.kvstore.server"]
    assert server_label(1) == "server1" and server_dirname(1) == "server.1"


def test_remote_workers_get_mxnet_and_ps_lite_settings():
    base = {"DMLC_INTERFACE": "eth0", "MXNET_KVSTORE_BIGARRAY_BOUND": "10", "PS_VERBOSE": "2",
            "DMLC_ROLE": "user", "HOME": "/root"}
    added = ps_env("worker", JOB, 1, 2)
    env = forwarded_env(base, added)
    assert env["DMLC_INTERFACE"] == "eth0" and env["MXNET_KVSTORE_BIGARRAY_BOUND"] == "10"
    assert env["PS_VERBOSE"] == "2" and env["DMLC_ROLE"] == "worker" and "HOME" not in env


# --- output and failures -------------------------------------------------------------------------

class _Sink(io.BytesIO):
    def close(self):  # keep the bytes readable after the mux is done
        pass


def test_server_output_is_prefixed_and_written_to_its_own_folder(tmp_path):
    out, err = _Sink(), _Sink()
    mux = OutputMux(out, err, ranks_filter=[0], output_dir=str(tmp_path))
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    mux.add("server0", os.fdopen(r_out, "rb", buffering=0), os.fdopen(r_err, "rb", buffering=0),
            dirname="server.0")
    mux.start()
    os.write(w_err, b"registered\nlast")
    os.close(w_out)
    os.close(w_err)
    mux.close(timeout=5)
    # shown although --ranks-filter names only rank 0: the filter is about worker ranks
    assert err.getvalue().decode() == "[server0]<stderr>:registered\n[server0]<stderr>:last\n"
    assert (tmp_path / "server.0" / "stderr").read_bytes() == b"registered\nlast"
    assert mux.stderr_tail("server0") == ["registered", "last"]
    assert format_line("server1", "stdout", "x") == "[server1]<stdout>:x\n"


def test_a_server_failure_is_the_root_cause_and_named_as_a_server():
    worker = Failure(rank=0, host="localhost", pid=10, returncode=1, when=20.0, error={"timestamp": 1.0})
    server = Failure(rank=1, host="localhost", pid=11, returncode=-9, when=20.5, kind="server",
                     stderr_tail=["boom"])
    root = pick_root_cause([worker, server])
    assert root is server  # workers fail because a server died, never the reverse
    text = format_root_cause(root, [worker], stopped=[1], stopped_servers=[0])
    assert "  server     : 1 (parameter server, host localhost)" in text
    assert "status     : killed by SIGKILL (signal 9)" in text and "    boom" in text
    assert "  rank 0 (host localhost, pid 10): exit code 1" in text
    assert "Stopped by the launcher: ranks 1" in text and "Stopped by the launcher: servers 0" in text
    clean_exit = Failure(rank=0, host="h", pid=1, returncode=0, kind="server")
    assert "ended before the workers did" in format_root_cause(clean_exit)
    assert worker.name == "rank 0" and server.name == "server 1"
