"""The documentation against the code, read as a user reads it: every accordrun flag the
launcher page's tables name, every command line the docs show, every environment variable they
name (with the defaults they state), the links between the pages and the README's two commands.
Nothing is started: the checks ask the parsers, the validation and ``accord.config``."""
import os
import re
import shlex
import sys

import pytest

from accord import config
from accord.run import mxnet_launch
from accord.run.cli import build_parser
from accord.run.config.launch_config import config_from_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md", "SECURITY.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))

pytestmark = pytest.mark.timeout(60)


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _accordrun_options():
    return set(build_parser()._option_string_actions)


def _expand(flag):
    """``--log-with(out)-timestamp`` -> both spellings; ``--(no-)x`` -> ``--x``, ``--no-x``."""
    m = re.search(r"\(([\w-]+)\)", flag)
    if not m:
        return [flag]
    return _expand(flag[:m.start()] + flag[m.end():]) + _expand(flag[:m.start()] + m.group(1) + flag[m.end():])


def _table_flags(text):
    """The flags in the first cell of every table row: ``-np``, ``--num-proc N`` -> both."""
    flags = set()
    for line in text.splitlines():
        if not line.startswith("| `-"):
            continue
        first_cell = line.split("|")[1]
        for span in re.findall(r"`([^`]+)`", first_cell):
            flags.update(word for word in span.split() if word.startswith("-"))
    return flags


def test_every_flag_in_the_launcher_pages_tables_is_an_accordrun_flag():
    flags = _table_flags(_read("docs/launcher.md"))
    assert len(flags) > 40, flags  # both tables were read: the flags and the elastic ones
    assert sorted(flags - _accordrun_options()) == []


def test_horovodrun_flags_the_launcher_page_lists_are_accepted():
    """The paragraph on horovodrun's command lines names flags accordrun takes (or refuses with
    a HINT); each must at least be known to the parser."""
    text = _read("docs/launcher.md")
    start = text.index("**horovodrun's command lines**")
    paragraph = text[start:text.index("\n\n", start)]
    named = set()
    for span in re.findall(r"`([^`]+)`", paragraph):
        named.update(w for w in span.split() if w.startswith("-") and "*" not in w)
    flags = {f for flag in named for f in _expand(flag)}
    assert {"--gloo", "--tcp", "--mpi", "--config-file", "-hostfile"} <= flags, flags
    assert sorted(flags - _accordrun_options()) == []


def _bash_lines(text):
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                yield line


def _doc_command_lines(program):
    """(doc, argv after ``program``) for each line of a ```bash block that runs ``program``."""
    found = []
    for doc in DOCS:
        for line in _bash_lines(_read(doc)):
            words = [os.path.expanduser(w) for w in shlex.split(line, comments=True)]  # as the shell
            names = [os.path.basename(w) for w in words]
            if program in names:
                found.append((doc, words[names.index(program) + 1:]))
    return found


@pytest.fixture
def doc_workdir(tmp_path, monkeypatch):
    """A folder holding what the docs' command lines refer to: the hostfile example of
    docs/launcher.md, a discovery script, an ssh key."""
    hostfile = re.search(r"```text\n(# hosts\.txt\n.*?)```", _read("docs/launcher.md"), re.S).group(1)
    (tmp_path / "hosts.txt").write_text(hostfile)
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho node1:2\necho node2:2\n")
    script.chmod(0o755)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("not a key\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_accordrun_command_line_in_the_docs_is_accepted(doc_workdir):
    """Each ``accordrun ...`` line of a bash block parses and validates (exit 2 would be bad
    input); nothing is started. ``python`` is this interpreter's folder on PATH."""
    commands = _doc_command_lines("accordrun")
    assert len(commands) >= 15, commands
    environ = {"PATH": os.path.dirname(sys.executable), "HOME": str(doc_workdir)}
    for doc, argv in commands:
        ns = build_parser().parse_args(argv)
        if ns.check_build or ns.help_env:
            continue
        try:
            config_from_args(ns, environ, cwd=str(doc_workdir))
        except Exception as exc:  # noqa: BLE001 - name the doc and the line
            pytest.fail(f"{doc}: accordrun {shlex.join(argv)}: {type(exc).__name__}: {exc}")


def test_the_hostfile_example_has_the_slots_the_page_states(doc_workdir):
    """docs/launcher.md: "-np defaults to all slots (11)" for its hosts.txt."""
    stated = re.search(r"accordrun --hostfile hosts\.txt python train\.py\s+# -np defaults to all slots \((\d+)\)",
                       _read("docs/launcher.md")).group(1)
    ns = build_parser().parse_args(["--hostfile", "hosts.txt", "python", "train.py"])
    cfg = config_from_args(ns, {"PATH": os.path.dirname(sys.executable)}, cwd=str(doc_workdir))
    assert cfg.num_proc == int(stated)


def test_every_accord_mxnet_launch_command_line_in_the_docs_is_accepted(tmp_path):
    commands = _doc_command_lines("accord-mxnet-launch")
    assert len(commands) >= 2, commands
    (tmp_path / "hosts").write_text("node1\nnode2\n")
    for doc, argv in commands:
        argv = [str(tmp_path / "hosts") if a == "hosts" else a for a in argv]
        ns = mxnet_launch.build_parser().parse_args(argv)
        run_argv = mxnet_launch.accordrun_argv(ns, has_sync_flag=True)
        assert build_parser().parse_args(run_argv).ps == "mxnet", (doc, run_argv)


# Variables the docs name that are not accord's to read: the scripts' and tests' own settings
# (each checked below to be read where the docs say), and one Horovod variable accord does not need.
NOT_ACCORDS = {
    "ACCORD_GPU_PYTHON": "scripts/gpu_check.sh",
    "ACCORD_OLDEST_TORCH": "scripts/test_oldest_torch.sh",
    "ACCORD_OLDEST_PYTHON": "scripts/test_oldest_torch.sh",
    "ACCORD_GPU_TESTS_ON_CPU": "tests/helpers/gpu_checks.py",
    "HOROVOD_DYNAMIC_PROCESS_SETS": None,  # docs/horovod-parity.md: accord does not need it
}
VARIABLE = re.compile(r"\b(?:ACCORD|HOROVOD|DMLC|MXNET|PS)_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_environment_variable_the_docs_name_is_declared_in_config():
    declared = set(config.VARIABLES) | {a for v in config.VARIABLES.values() for a in v.aliases}
    unknown = {}
    for doc in DOCS:
        for name in set(VARIABLE.findall(_read(doc))) - declared - set(NOT_ACCORDS):
            unknown.setdefault(name, []).append(doc)
    assert unknown == {}
    for name, reader in NOT_ACCORDS.items():
        if reader:
            assert name in _read(reader), (name, reader)


# Defaults the docs (docs/*.md, SECURITY.md) state for variables, as accord.config declares them.
STATED_DEFAULTS = {
    "ACCORD_CPU_BACKEND": "auto",                      # performance.md: ACCORD_CPU_BACKEND=auto, the default
    "ACCORD_GPU_BACKEND": "auto",                      # gpus.md: `auto` (default)
    "ACCORD_HIERARCHICAL_MIN_BYTES": 1 << 20,          # launcher.md: (1 MiB)
    "ACCORD_FUSION_THRESHOLD": 64 << 20,               # performance.md: 64 MB by default
    "ACCORD_LOG_LEVEL": "warning",                     # launcher.md: warning (default)
    "ACCORD_MAX_OBJECT_BYTES": 2 << 30,                # SECURITY.md: default 2 GiB
    "ACCORD_GIL_SWITCH_INTERVAL": 1.0,                 # performance.md: 1 ms while the engine runs
    "ACCORD_KVSTORE_CHUNK_ELEMENTS": 1 << 20,          # SECURITY.md: 64 KiB + 16 B x it = 16.1 MiB
}


def test_the_defaults_the_docs_state_are_configs():
    assert {name: config.VARIABLES[name].default for name in STATED_DEFAULTS} == STATED_DEFAULTS
    assert "`ACCORD_HIERARCHICAL_MIN_BYTES` (1 MiB)" in _read("docs/launcher.md")


def test_the_engines_cycle_defaults_are_the_performance_pages():
    """docs/performance.md: ACCORD_CYCLE_QUIET_TIME default 0.5 ms, ACCORD_CYCLE_TIME default 30
    ms on Gloo and MPI; on shm the engine gathers until a caller waits, one second at most."""
    from accord.engine.settings import default_cycle_times

    page = _read("docs/performance.md")
    assert "`ACCORD_CYCLE_QUIET_TIME` (default 0.5 ms)" in page
    assert "(`HOROVOD_CYCLE_TIME`, default 30 ms" in page
    assert "gathers until a caller waits (one second at most)" in page
    for backend in ("gloo", "mpi"):
        cycle, quiet, _ = default_cycle_times(backend)
        assert (cycle, quiet) == (0.030, 0.0005)
    assert default_cycle_times("shm")[0] == 1.0


def test_launcher_flag_defaults_are_the_pages():
    """The defaults the flag tables of docs/launcher.md state, against the parser's."""
    from accord.run.config.launch_config import DEFAULT_GRACE
    from accord.run.elastic import config as elastic_config
    from accord.run.spec.flag_values import MAX_GRACE_S

    page = _read("docs/launcher.md")
    assert ("| `--grace-period S` | seconds between SIGTERM and SIGKILL when stopping workers (default 5), "
            "from 0 to 3600 (an hour; more exits 2) |") in page
    assert DEFAULT_GRACE == 5 and MAX_GRACE_S == 3600
    assert "(default `accept-new`)" in page
    assert build_parser().parse_args(["python"]).ssh_strict_host_key_checking == "accept-new"
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip()
            for line in page.splitlines() if line.startswith("| `--discovery-interval") or
            line.startswith("| `--elastic-timeout")}
    assert rows == {"`--discovery-interval S`": "2", "`--elastic-timeout S`": "600"}
    assert elastic_config.DEFAULT_DISCOVERY_INTERVAL == 2
    assert elastic_config.DEFAULT_ELASTIC_TIMEOUT == 600


def _anchors(path):
    """GitHub's heading anchors of a markdown file."""
    found = set()
    for line in _read(path).splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def _generated_by_the_site():
    """The files the docs site's hooks draw at build time (tools/docs/hooks.py: the plots)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_accord_docs_hooks", os.path.join(ROOT, "tools", "docs", "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    for result_json in hooks.PLOTS.values():  # each is drawn from a recorded result that exists
        assert os.path.exists(os.path.join(ROOT, "benchmarks", "results", result_json)), result_json
    return {os.path.join("docs", uri) for uri in hooks.PLOTS}


def test_links_between_the_docs_point_to_files_and_headings_that_exist():
    generated = _generated_by_the_site()
    checked = 0
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", _read(doc)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if full in generated:
                continue
            assert os.path.exists(os.path.join(ROOT, full)), (doc, target)
            if anchor:
                assert anchor in _anchors(full), (doc, target)
            checked += 1
    assert checked > 10


def test_the_readmes_two_commands_are_what_ci_and_the_main_job_run():
    readme = _read("README.md")
    first = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["bash scripts/main_job.sh", "bash scripts/test.sh"]
    ci = [line for line in _read(".ci/run").splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["bash scripts/test.sh"]
    main_job = _read("scripts/main_job.sh")
    assert re.search(r"^exec \.venv/bin/accordrun -np 2 \.venv/bin/python examples/digits_fit\.py$", main_job, re.M)
    assert "(`examples/digits_fit.py` under `accordrun -np 2`)" in readme


def _stub_python(path, pytest_status):
    """A stand-in interpreter: ``-m pytest`` exits ``pytest_status``, anything else 0."""
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n"
                    f'case " $* " in *" -m pytest "*) exit {pytest_status} ;; esac\n'
                    "exit 0\n")
    path.chmod(0o755)


@pytest.mark.parametrize("args, venv_status, mxnet_status, expected", [
    (["tests/with_mxnet"], 5, 0, 0),     # README: `bash scripts/test.sh tests/with_mxnet` runs them
    (["tests/with_mxnet"], 5, 1, 1),     # ... and fails when they fail in .venv-mxnet
    (["tests/with_mxnet"], 1, 0, 1),     # a real failure in .venv still counts
    (["tests/unit", "-k", "nothing"], 5, 0, 5),  # an empty selection elsewhere stays an error
    ([], 0, 0, 0),
    ([], 0, 2, 2),
])
def test_test_sh_with_the_mxnet_folder_passes_when_its_tests_pass(tmp_path, args, venv_status,
                                                                  mxnet_status, expected):
    """scripts/test.sh runs pytest twice for tests/with_mxnet: in .venv, where those tests skip
    themselves at import (pytest: 5, no tests collected), then in .venv-mxnet. The first run's
    5 is no failure. The script runs here on stand-ins for setup_env.sh and the interpreters."""
    import subprocess

    (tmp_path / "scripts").mkdir()
    with open(os.path.join(ROOT, "scripts", "test.sh"), encoding="utf-8") as f:
        (tmp_path / "scripts" / "test.sh").write_text(f.read())
    (tmp_path / "scripts" / "setup_env.sh").write_text("exit 0\n")
    _stub_python(tmp_path / ".venv" / "bin" / "python", venv_status)
    _stub_python(tmp_path / ".venv-mxnet" / "bin" / "python", mxnet_status)
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "test.sh"), *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == expected, proc.stdout + proc.stderr
