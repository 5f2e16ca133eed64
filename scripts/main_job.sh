#!/usr/bin/env bash
# Install (into .venv) and run the main job: 2-rank LeNet training on scikit-learn's bundled digits.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
exec .venv/bin/accordrun -np 2 .venv/bin/python examples/digits_fit.py
