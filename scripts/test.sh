#!/usr/bin/env bash
# Install (into .venv) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
