"""A Horovod-style script that never calls shutdown() must still exit cleanly (status 0).

The engine must stop before the runtime's atexit close destroys the Gloo process group: the
other order destroys it under a running engine thread, and the process dies with SIGABRT.
"""
import os
import subprocess
import sys

import pytest

SCRIPT = """
import torch
import accord.torch as hvd
hvd.init()
for step in range(20):
    hvd.allreduce(torch.ones(1000), name=f"g{step % 3}")
print("rank", hvd.rank(), "done")
"""


@pytest.mark.timeout(120)
def test_scripts_without_shutdown_exit_cleanly(tmp_path):
    script = tmp_path / "no_shutdown.py"
    script.write_text(SCRIPT)
    for _attempt in range(3):  # the wrong order shows in a few runs out of ten, not in every one
        proc = subprocess.run([sys.executable, "-m", "accord.run", "-np", "2", sys.executable, str(script)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "[0]<stdout>:rank 0 done" in proc.stdout and "[1]<stdout>:rank 1 done" in proc.stdout
