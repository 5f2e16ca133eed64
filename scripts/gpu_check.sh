#!/usr/bin/env bash
# GPU readiness in one command: on a machine with a CUDA GPU, run every `gpu`-marked
# test and the GPU benchmarks, and write benchmarks/results/gpu/gpu_check.json + gpu_check.md
# (copied, with the logs, to $OUT when that is set). Without a GPU it says so, runs nothing and
# exits 0. Exit status otherwise: 0 when every gpu test passed, 1 when one failed.
#
#   bash scripts/gpu_check.sh            # 4-5 minutes on one H200 (each part has a budget: at most ~9)
#
# Which Python: $ACCORD_GPU_PYTHON, else the first of python3 and .venv/bin/python whose torch
# sees a GPU (on the lent GPU machines python3 holds a CUDA build of torch; it has no network).
# If none does but nvidia-smi sees a GPU, it tries to install the pinned torch (a CUDA build on
# PyPI for Linux) with pytest into .venv-gpu; without network that fails and it says so.
# pytest and pytest-timeout come from .whl/*.whl (wheels carried along) when that folder exists.
# accord itself is used from src/ (no install). Budgets: tests 220 s, benchmarks 285 s (hard limit 300 s): about 9 minutes at worst.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RES=benchmarks/results/gpu
TORCH_PIN="${ACCORD_GPU_TORCH:-torch==2.13.0}"
SECONDS=0
say() { echo "gpu_check: $*"; }

sees_gpu() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }

PY=""
for candidate in "${ACCORD_GPU_PYTHON:-}" python3 .venv/bin/python .venv-gpu/bin/python; do
  [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
  if sees_gpu "$candidate"; then PY="$candidate"; break; fi
done
if [ -z "$PY" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  say "nvidia-smi sees a GPU but no Python here has a CUDA build of torch; installing $TORCH_PIN into .venv-gpu"
  [ -x .venv-gpu/bin/python ] || python3 -m venv .venv-gpu
  timeout 600 .venv-gpu/bin/python -m pip install -q --retries 0 --timeout 20 "$TORCH_PIN" numpy pytest pytest-timeout \
    || say "could not install $TORCH_PIN (no network?)"
  sees_gpu .venv-gpu/bin/python && PY=.venv-gpu/bin/python
fi
if [ -z "$PY" ]; then
  say "no CUDA GPU visible here (nvidia-smi: $(command -v nvidia-smi >/dev/null && echo present || echo absent);" \
      "no Python with a CUDA build of torch that sees a device): nothing run"
  exit 0
fi
say "using $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"

# What the tests need beyond torch and numpy: carried wheels, else pip (needs network).
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import numpy, pytest, pytest_timeout" >/dev/null 2>&1; then
  SITE=$(mktemp -d /tmp/accord-gpu-site.XXXXXX)
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl
  else
    "$PY" -m pip install -q --retries 0 --timeout 20 --target "$SITE" numpy pytest pytest-timeout \
      || say "could not install pytest/pytest-timeout (no network and no .whl/): tests will not run"
  fi
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi

rm -rf "$RES" && mkdir -p "$RES"
"$PY" - "$RES/environment.json" <<'EOF'
import json, platform, subprocess, sys
import torch
def smi(field):
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception as exc:  # noqa: BLE001
        return f"unknown ({type(exc).__name__})"
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:  # noqa: BLE001
    nccl = "none"
env = {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
       "memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
       "driver": smi("driver_version"), "torch": torch.__version__, "cuda": torch.version.cuda,
       "nccl": nccl, "python": platform.python_version(), "host": platform.node(),
       "cpus": __import__("os").cpu_count()}
json.dump(env, open(sys.argv[1], "w"), indent=2)
print("gpu_check: machine", env)
EOF

# 1. every gpu-marked test (the files that carry the marker, so modules whose imports need
#    packages this machine lacks are never collected)
mapfile -t FILES < <(grep -rl "mark\.gpu" tests --include='test_*.py' | sort)
say "gpu tests in ${#FILES[@]} files: ${FILES[*]}"
# SIGINT at the limit: pytest stops and still writes the XML of the tests that finished.
timeout -s INT -k 20 220 "$PY" -m pytest -p no:cacheprovider -q -m gpu -rs "${FILES[@]}" \
  --junitxml="$RES/pytest_gpu.xml" 2>&1 | tee "$RES/pytest_gpu.log"
say "tests done at ${SECONDS}s"

# 2. the benchmarks (each part under its share of the budget)
timeout -k 10 300 "$PY" benchmarks/gpu_bench.py --out "$RES" --budget-s 285 2>&1 | tee "$RES/gpu_bench.log"
say "benchmarks done at ${SECONDS}s"

# 3. one JSON + markdown, and what comes back from a lent machine ($OUT: at most 8 files)
"$PY" benchmarks/gpu_summary.py --out "$RES" --seconds "$SECONDS"
STATUS=$?
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  for f in gpu_check.json gpu_check.md pytest_gpu.xml pytest_gpu.log gpu_bench.log; do
    [ -f "$RES/$f" ] && cp "$RES/$f" "$OUT/"
  done
  tar -czf "$OUT/gpu_results.tar.gz" -C "$RES" .
  say "copied the summary, logs and gpu_results.tar.gz to \$OUT"
fi
say "finished in ${SECONDS}s (exit $STATUS)"
exit $STATUS
