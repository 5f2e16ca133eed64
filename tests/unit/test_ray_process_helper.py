"""tests/helpers/ray_processes.py tells Ray's processes from others that merely name Ray's folders
(the harness's fork server, whose command line carries sys.path once Ray is imported): ending
the wrong one broke every later test of that worker."""
import pytest

psutil = pytest.importorskip("psutil")

from helpers.ray_processes import _is_ray  # noqa: E402

SITE = "/venv/lib/python3.11/site-packages"


class _Proc:
    def __init__(self, argv):
        self.argv = argv

    def cmdline(self):
        return self.argv


@pytest.mark.parametrize("argv, ray", [
    ([f"{SITE}/ray/core/src/ray/raylet/raylet", "--node-ip-address=127.0.0.1"], True),
    ([f"{SITE}/ray/core/src/ray/gcs/gcs_server", "--gcs_server_port=0"], True),
    (["ray::IDLE", ""], True),
    (["/venv/bin/python", "-u", f"{SITE}/ray/dashboard/agent.py", "--node-id=ab"], True),
    (["/venv/bin/python", "-c", "from multiprocessing.forkserver import main; main(3, 4, ['accord.torch'], "
      f"**{{'sys_path': ['{SITE}/ray/thirdparty_files']}})"], False),
    (["/venv/bin/python", "-B", "-c", f"import sys; sys.path[:0] = ['{SITE}/ray/thirdparty_files']"], False),
    (["/venv/bin/python", "-u", "/repo/tests/helpers/worker.py", f"--path={SITE}/ray/x.py"], False),
    ([], False),
])
def test_only_rays_own_programs_count(argv, ray):
    assert _is_ray(_Proc(argv)) is ray
