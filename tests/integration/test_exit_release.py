"""exit_release's RUNNER runs a script as Python does, and frees its globals before teardown.

Each test runs a small script twice, ``python script.py`` and through ``wrap`` (what the
launcher runs), and compares what the script saw; the launcher tests check that accordrun uses
it (and ``--no-exit-release`` does not).
"""
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accord.run.processes.exit_release import wrap

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

# What a script can see of how it was started.
_INTROSPECT = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__,
                  "spec": repr(__spec__), "loader": type(__loader__).__name__,
                  "package": __package__, "cwd_file": os.path.exists(__file__),
                  "main_is_us": sys.modules["__main__"].__dict__ is globals()}))
"""

# Prints, in order: what the script's atexit handler saw, then when its global object was freed.
_PROBE = """
import atexit, sys

RECORD = []  # defined first, so freed last: the objects below still find it

class Probe:
    def __del__(self):
        RECORD.append(1)
        print("freed finalizing=%s record=%d" % (sys.is_finalizing(), len(RECORD)), flush=True)

SETTING = 42
probe = Probe()
cycle = [Probe()]
cycle.append(cycle)  # only the cycle collector frees this one
atexit.register(lambda: print("atexit saw %s" % SETTING, flush=True))
print("script done", flush=True)
"""


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _run(argv, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags, args", [([], []), (["-u"], ["--lr", "0.1", "-m", "x"]), (["-W", "ignore"], ["a"])])
def test_the_script_sees_what_plain_python_gives_it(tmp_path, flags, args):
    _write(tmp_path, "sub/train.py", _INTROSPECT)
    argv = [sys.executable, *flags, "sub/train.py", *args]
    plain, wrapped = _run(argv, tmp_path), _run(wrap(argv), tmp_path)
    assert plain.returncode == wrapped.returncode == 0, (plain.stderr, wrapped.stderr)
    seen = json.loads(wrapped.stdout)
    assert seen == json.loads(plain.stdout)
    assert seen["argv"] == ["sub/train.py", *args]
    assert seen["path0"] == str((tmp_path / "sub").resolve())
    assert seen["name"] == "__main__" and seen["main_is_us"]


@pytest.mark.timeout(60)
def test_exit_status_and_traceback_are_pythons(tmp_path):
    _write(tmp_path, "exits.py", "import sys\nsys.exit(7)\n")
    _write(tmp_path, "raises.py", """\
        def inner():
            raise ValueError("bad value 3")
        inner()
        """)
    _write(tmp_path, "broken.py", "x = (\n")
    stderr = {}
    for name, code in (("exits.py", 7), ("raises.py", 1), ("broken.py", 1)):
        argv = [sys.executable, name]
        plain, wrapped = _run(argv, tmp_path), _run(wrap(argv), tmp_path)
        assert plain.returncode == wrapped.returncode == code, name
        assert wrapped.stderr == plain.stderr, name  # no frame of the runner in the traceback
        stderr[name] = wrapped.stderr
    assert stderr["raises.py"].endswith("ValueError: bad value 3\n")
    assert "in inner" in stderr["raises.py"] and "<string>" not in stderr["raises.py"]
    assert "SyntaxError" in stderr["broken.py"]


@pytest.mark.timeout(60)
def test_globals_are_freed_after_atexit_handlers_and_before_teardown(tmp_path):
    _write(tmp_path, "probe.py", _PROBE)
    argv = [sys.executable, "probe.py"]
    wrapped = _run(wrap(argv), tmp_path)
    assert wrapped.returncode == 0, wrapped.stderr
    # the most recent global first (the cycle, collected at once), then the plain object
    assert wrapped.stdout.splitlines() == ["script done", "atexit saw 42",
                                           "freed finalizing=False record=1", "freed finalizing=False record=2"]
    plain = _run(argv, tmp_path)  # the same objects, freed by the interpreter's teardown
    assert plain.stdout.splitlines()[:2] == ["script done", "atexit saw 42"]
    assert "freed finalizing=False" not in plain.stdout


# Counts the full collections the release makes: RELEASING is set by the script's own atexit
# handler, which runs before the release (handlers run last-registered first).
_COLLECTIONS = """
import atexit, gc, sys

STATE = {"releasing": False, "full": 0}

def count(phase, info):
    if phase == "start" and info["generation"] == 2 and STATE["releasing"]:
        STATE["full"] += 1
        sys.stdout.write("full collection %d\\n" % STATE["full"])
        sys.stdout.flush()

gc.callbacks.append(count)
held = []
shared_list = [1, 2]        # tracked and held by `held` too: collected after it is released
held.append(shared_list)
small = 7                   # small ints and interned strings are held everywhere: untracked
name = "interned"
pair = (small, name)        # a tuple of untracked values: untracked itself
settings = {"lr": 0.1}      # a dict of untracked values: untracked
atexit.register(lambda: STATE.update(releasing=True))
"""


@pytest.mark.timeout(60)
def test_only_globals_that_can_be_in_a_cycle_make_the_release_collect(tmp_path):
    _write(tmp_path, "release_collections.py", _COLLECTIONS)
    wrapped = _run(wrap([sys.executable, "release_collections.py"]), tmp_path)
    assert wrapped.returncode == 0, wrapped.stderr
    # one: for shared_list (held by `held`); none for the untracked values, whatever their refcount
    assert wrapped.stdout.splitlines() == ["full collection 1"], wrapped.stdout


@pytest.mark.timeout(60)
def test_functions_of_the_script_reach_spawned_processes(tmp_path):
    _write(tmp_path, "pool.py", """\
        import multiprocessing

        def square(x):
            return x * x

        if __name__ == "__main__":
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                print(pool.map(square, [1, 2, 3]))
        """)
    wrapped = _run(wrap([sys.executable, "pool.py"]), tmp_path)
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout.strip() == "[1, 4, 9]"


@pytest.mark.timeout(60)
def test_a_directory_with_a_main_module_still_runs(tmp_path):
    _write(tmp_path, "app/__main__.py", "import sys\nprint('app', sys.argv[1:])\n")
    wrapped = _run(wrap([sys.executable, "app", "x"]), tmp_path)
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout.strip() == "app ['x']"


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("flag, finalizing", [((), False), (("--no-exit-release",), True)])
def test_accordrun_releases_a_scripts_globals_unless_told_not_to(tmp_path, flag, finalizing):
    script = _write(tmp_path, "probe.py", _PROBE)
    proc = lib.accordrun(*flag, "-np", "2", lib.PYTHON, str(script), timeout=50)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        lines = [line.split(":", 1)[1] for line in proc.stdout.splitlines()
                 if line.startswith(f"[{rank}]<stdout>:")]
        assert lines[:2] == ["script done", "atexit saw 42"]
        assert sum(line.startswith(f"freed finalizing={finalizing} ") for line in lines) == 2, proc.stdout
