#!/usr/bin/env bash
# Install (into .venv) and run the main job: a 2-rank accord job on this machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
exec .venv/bin/accordrun -np 2 .venv/bin/python examples/collectives_demo.py
