#!/usr/bin/env bash
# Run the tests against the oldest torch the package accepts (torch>=2.4 in pyproject.toml), on
# the oldest Python it accepts where this machine has one (python3.10, else python3), in its own
# venv (.venv-torch-oldest). Not part of CI: PyPI's Linux wheels of torch 2.4 are CUDA
# builds, about 5 GB with their NVIDIA libraries (the CPU-only wheels live on a download server
# this project does not use). They run on the CPU.
#
#   bash scripts/test_oldest_torch.sh                    # unit, multiprocess and integration tests
#   bash scripts/test_oldest_torch.sh tests/unit -q      # arguments go to pytest
#   ACCORD_OLDEST_TORCH=2.5.1 ACCORD_OLDEST_PYTHON=python3.12 bash scripts/test_oldest_torch.sh
#
# What differs on old torch and how accord handles it: docs/torch-versions.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TORCH="torch==${ACCORD_OLDEST_TORCH:-2.4.1}"
VENV=.venv-torch-oldest
BASE_PYTHON="${ACCORD_OLDEST_PYTHON:-}"
if [ -z "$BASE_PYTHON" ]; then
  # (a pyenv shim can exist for a version it will not run: try each)
  for candidate in python3.10 python3; do
    if "$candidate" -c "import venv" >/dev/null 2>&1; then BASE_PYTHON="$candidate"; break; fi
  done
fi
[ -x "$VENV/bin/python" ] || "$BASE_PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$TORCH" numpy 'pytest>=8' \
    'pytest-timeout>=2.3' 'msgpack>=1.0' 'cryptography>=42' scikit-learn mpi4py \
    'pyyaml>=5.1' 'cloudpickle>=2' matplotlib tqdm 2>&1 \
  | grep -v -E "^WARNING: Location .* is ignored" || true
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 \
  | grep -v -E "^WARNING: Location .* is ignored" || true
"$VENV/bin/python" -c "import sys, torch, accord.torch; print('Python', sys.version.split()[0], 'torch', torch.__version__)"
if [ $# -eq 0 ]; then
  set -- tests/unit tests/multiprocess tests/integration
fi
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
