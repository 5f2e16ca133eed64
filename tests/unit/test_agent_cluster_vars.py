"""The agent's place in the job from flags, Kubernetes' PET_* and SLURM's variables (pure)."""
import pytest

from accord.errors import ConfigError
from accord.host_lists import expand_nodelist
from accord.run.agent.cluster_vars import agent_mode, agent_spec, parse_endpoint, parse_nnodes
from accord.run.cli import build_parser

HEX = "ab" * 32


def _ns(*args):
    return build_parser().parse_args([*args, "python", "train.py"])


def test_flags_win_over_pet_which_win_over_slurm():
    env = {"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "4", "PET_MASTER_ADDR": "pet-master",
           "PET_MASTER_PORT": "1234", "SLURM_STEP_ID": "0", "SLURM_NNODES": "5", "SLURM_NODEID": "4",
           "SLURM_JOB_NODELIST": "n[1-5]", "ACCORD_JOB_SECRET": HEX}
    spec = agent_spec(_ns("--nnodes", "2", "--node-rank", "1"), env)
    assert (spec.min_nodes, spec.max_nodes, spec.node_rank, spec.nproc) == (2, 2, 1, 4)
    assert (spec.endpoint_host, spec.endpoint_port) == ("pet-master", 1234)
    assert spec.sources == {"nnodes": "--nnodes", "node_rank": "--node-rank", "nproc_per_node": "PET_NPROC_PER_NODE",
                            "endpoint": "PET_MASTER_ADDR", "secret": "ACCORD_JOB_SECRET"}
    slurm = {k: v for k, v in env.items() if not k.startswith("PET_")}
    spec = agent_spec(_ns("--nproc-per-node", "2"), slurm)
    assert (spec.max_nodes, spec.node_rank, spec.nproc, spec.endpoint) == (5, 4, 2, "n1:29400")


def test_agents_of_an_srun_step_meet_on_the_steps_own_port():
    step = {"SLURM_STEP_ID": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[7-8]",
            "SLURM_JOB_ID": "123456", "ACCORD_JOB_SECRET": HEX}
    spec = agent_spec(_ns("--nproc-per-node", "2"), step)
    assert spec.endpoint == f"n7:{20000 + 10 * (123456 % 1000) + 2}"
    # another job's step on the same nodes meets elsewhere
    other = agent_spec(_ns("--nproc-per-node", "2"), {**step, "SLURM_JOB_ID": "123457"})
    assert other.endpoint_port != spec.endpoint_port
    assert agent_spec(_ns("--nproc-per-node", "2"), {**step, "MASTER_PORT": "4000"}).endpoint == "n7:4000"
    with pytest.raises(ConfigError, match="SLURM_JOB_ID='x1' is not an integer"):
        agent_spec(_ns("--nproc-per-node", "2"), {**step, "SLURM_JOB_ID": "x1"})


def test_agent_mode_needs_an_agent_flag_pet_or_an_srun_step():
    assert agent_mode(_ns("--nnodes", "2"), {})
    assert agent_mode(_ns(), {"PET_NNODES": "2"})
    assert not agent_mode(_ns("-np", "2"), {"PET_NNODES": "2"})  # a launch-host job stays one
    srun = {"SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "2"}
    assert agent_mode(_ns("--nproc-per-node", "2"), srun)
    assert not agent_mode(_ns("--nproc-per-node", "2"), {k: v for k, v in srun.items() if k != "SLURM_STEP_ID"})
    assert not agent_mode(_ns(), srun)


def test_nnodes_endpoint_and_nodelist_parsing():
    assert parse_nnodes("2", "--nnodes") == (2, 2) and parse_nnodes("2:4", "--nnodes") == (2, 4)
    for bad in ("0", "3:2", "a", "1:2:3"):
        with pytest.raises(ConfigError, match="HINT:"):
            parse_nnodes(bad, "--nnodes")
    assert parse_endpoint("job-worker-0.job-worker:5", "x") == ("job-worker-0.job-worker", 5)
    assert parse_endpoint("[::1]:7", "x") == ("::1", 7) and parse_endpoint("h", "x") == ("h", 29400)
    assert expand_nodelist("a[1-3,5]") == ["a1", "a2", "a3", "a5"]
    assert expand_nodelist("job-[00-01],x") == ["job-00", "job-01", "x"]


def test_a_secret_is_required_unless_opted_out(tmp_path):
    env = {"PET_NNODES": "2", "PET_MASTER_ADDR": "m"}
    with pytest.raises(ConfigError, match="needs the job's secret") as info:
        agent_spec(_ns(), env)
    assert "HINT:" in str(info.value)
    open_spec = agent_spec(_ns("--no-job-secret"), env)
    assert not open_spec.authenticated and len(open_spec.secret) == 32
    path = tmp_path / "s"
    path.write_text(HEX)
    path.chmod(0o600)
    link = tmp_path / "link"  # a Kubernetes Secret volume's file is a link into ..data/
    link.symlink_to(path)
    assert agent_spec(_ns("--secret-file", str(link)), env).secret == bytes.fromhex(HEX)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        agent_spec(_ns("--secret-file", str(path)), env)
