"""Every Python block of the guides runs, as the page says to run it, so the docs cannot rot.

A guide marks each ```python block with the command that runs it, on the line before the fence:

    <!-- run: accordrun -np 2 -->            the block is train.py of `accordrun -np 2 python train.py`
    <!-- run: accordrun -np 2 --min-np 1 -->  (any accordrun flags)
    <!-- run: python -->                      one process: `python train.py`
    <!-- run: mxnet accordrun -np 2 -->      the same, with the interpreter of .venv-mxnet (MXNet 1.9.1)
    <!-- run: none (why) -->                  not a program (a few lines of one); at most 3 such blocks

A block without a mark fails the first test. Blocks are whole programs that check their own
results (an ``assert`` on a value computed another way), so running them is the test. To keep
the time small, blocks with the same command run in one job: a driver runs each block in turn
with ``runpy`` (as ``__main__``, in a fresh namespace, in the order of GUIDES), and names the page
and block that failed; ``python`` blocks (which start their own workers) share one process.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from helpers import framework_jobs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The pages whose Python blocks are programs (the other pages show fragments of programs).
# Order matters only for speed and isolation: troubleshooting's deliberate mismatch goes last.
GUIDES = ["README.md", "docs/getting-started.md", "docs/from-horovod.md", "docs/from-mxnet.md",
          "docs/from-torchrun.md", "docs/from-paddle.md", "docs/elastic.md", "docs/parameter-servers.md",
          "docs/multi-host.md", "docs/gpus.md", "docs/performance.md", "docs/launcher.md",
          "docs/troubleshooting.md"]
MXNET_PYTHON = os.path.join(ROOT, ".venv-mxnet", "bin", "python")

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
_MARK = re.compile(r"<!-- run: (.+?) -->\s*\Z")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    command: str  # what follows "run:" (e.g. "accordrun -np 2"), "" when unmarked
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in GUIDES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
            text = fh.read()
        for m in _BLOCK.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            found.append(Block(page, text.count("\n", 0, m.start()) + 2, mark.group(1) if mark else "", m.group(1)))
    return found


def groups() -> dict[str, list[Block]]:
    out: dict[str, list[Block]] = {}
    for b in blocks():
        if not b.command.startswith("none"):
            out.setdefault(b.command, []).append(b)
    return out


def test_every_python_block_of_the_guides_says_how_it_runs():
    found = blocks()
    assert len(found) >= 12, [b.where for b in found]  # the guides were read
    unmarked = [b.where for b in found if not b.command]
    assert unmarked == [], "python blocks without a `<!-- run: ... -->` line before them"
    not_run = [b for b in found if b.command.startswith("none")]
    assert len(not_run) <= 3, [b.where for b in not_run]
    assert all(re.fullmatch(r"none \(.{10,}\)", b.command) for b in not_run), not_run  # each says why
    for b in found:
        if b in not_run:
            continue
        words = b.command.split()
        if words[0] == "mxnet":
            words = words[1:]
        assert words[0] in ("accordrun", "python") and (words[0] == "accordrun" or len(words) == 1), b


def test_the_blocks_run_in_few_jobs():
    """The grouping that keeps this file fast: at most 6 jobs for every block of the guides."""
    assert len(groups()) <= 6, list(groups())


DRIVER = '''\
import runpy, sys
for path, where in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        print(f"DOCS BLOCK FAILED: {where}", file=sys.stderr, flush=True)
        raise
    print(f"DOCS BLOCK OK: {where}", flush=True)
'''


def _interpreter(command: str) -> tuple[str, list[str]]:
    words = command.split()
    if words[0] != "mxnet":
        return sys.executable, words
    probe = subprocess.run([MXNET_PYTHON, "-c", "import mxnet"], capture_output=True, timeout=60) \
        if os.path.exists(MXNET_PYTHON) else None
    if probe is None or probe.returncode != 0:
        pytest.skip("MXNet 1.9.1 is not importable in .venv-mxnet (scripts/setup_env.sh builds it: "
                    "pip install 'accord[mxnet]' in its own venv)")
    return MXNET_PYTHON, words[1:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", sorted(groups()))
def test_the_guides_blocks_run(command, tmp_path):
    group = groups()[command]
    python, words = _interpreter(command)
    files = []
    for i, b in enumerate(group):
        path = tmp_path / f"block{i}.py"
        path.write_text(b.code)
        files += [str(path), b.where]
    (tmp_path / "driver.py").write_text(DRIVER)
    if words[0] == "python":
        argv = [python, str(tmp_path / "driver.py"), *files]
    else:
        argv = [python, "-m", "accord.run", *words[1:], python, str(tmp_path / "driver.py"), *files]
    proc = framework_jobs.run(argv, timeout=200, cwd=str(tmp_path),
                              env_extra={"PYTHONPATH": os.path.join(ROOT, "src")})
    status, out = proc.returncode, proc.stdout
    assert status == 0, f"{command}: exit {status}\n{out[-8000:]}"
    ranks = 1 if words[0] == "python" else int(words[words.index("-np") + 1])
    for b in group:  # every rank ran every block (a rank that died in elastic.md does not count)
        done = out.count(f"DOCS BLOCK OK: {b.where}")
        assert done >= 1 and (done == ranks or "--min-np" in words), (b.where, done, out[-4000:])
