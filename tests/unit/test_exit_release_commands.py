"""Which worker commands the launcher runs through exit_release's RUNNER, and how it rewrites them."""
import pytest

from accord.run.processes.exit_release import RUNNER, is_python, script_index, wrap


@pytest.mark.parametrize("program", ["python", "python3", "python3.11", "/usr/bin/python3.11",
                                     ".venv/bin/python", "/opt/py/bin/python3.13"])
def test_interpreters_are_recognized(program):
    assert is_python(program)


@pytest.mark.parametrize("program", ["bash", "ipython", "pythonw.exe", "mypython", "torchrun", "/bin/sh",
                                     "python-config", "./train.py"])
def test_other_programs_are_not(program):
    assert not is_python(program)


@pytest.mark.parametrize("argv, index", [
    (["python", "train.py"], 1),
    (["python", "train.py", "-m", "x"], 1),  # the script's own arguments are not the interpreter's
    (["python", "-u", "train.py", "--lr", "0.1"], 2),
    (["python", "-uB", "train.py"], 2),
    (["python", "-W", "ignore", "train.py"], 3),
    (["python", "-Wignore", "train.py"], 2),
    (["python", "-uW", "error", "train.py"], 3),
    (["python", "-X", "dev", "-O", "train.py"], 4),
    (["python", "--check-hash-based-pycs", "never", "train.py"], 3),
    (["/usr/bin/python3", "dir/train.py"], 1),
])
def test_script_position(argv, index):
    assert script_index(argv) == index


@pytest.mark.parametrize("argv", [
    ["python", "-m", "pkg.train"],
    ["python", "-um", "pkg.train"],
    ["python", "-c", "print(1)"],
    ["python", "-"],
    ["python", "--", "train.py"],
    ["python", "--version"],
    ["python"],
    ["python", "-u"],
    ["bash", "run.sh"],
    ["./train.py"],
    [],
])
def test_commands_that_run_unchanged(argv):
    assert script_index(argv) is None
    assert wrap(argv) == tuple(argv)


def test_wrap_puts_the_runner_before_the_script_and_keeps_everything_else():
    argv = ["python", "-u", "-W", "ignore", "train.py", "--epochs", "3"]
    assert wrap(argv) == ("python", "-u", "-W", "ignore", "-c", RUNNER, "train.py", "--epochs", "3")


def test_runner_is_standard_library_only_and_valid_python():
    compile(RUNNER, "<runner>", "exec")  # a SyntaxError fails the test
    assert "accord" not in RUNNER  # a remote host needs nothing of accord to run it


def test_runner_is_the_text_of_its_module_which_does_nothing_when_imported():
    import accord.run.processes.exit_release_runner as runner_module

    with open(runner_module.__file__, encoding="utf-8") as source:
        assert RUNNER == source.read()  # what ruff checks is what the workers run
    assert callable(runner_module._run_script)  # imported, it defined the function and ran nothing
