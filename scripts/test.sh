#!/usr/bin/env bash
# Install (into .venv and .venv-mxnet), lint (ruff) and run the whole test suite. Extra arguments go
# to pytest (and skip the lint).
#
# tests/with_mxnet needs MXNet 1.9.1 and its numpy pin, which live in .venv-mxnet: the first run (in
# .venv) skips them with that reason, the second runs them in .venv-mxnet. With arguments, the
# second run happens only for arguments naming tests/with_mxnet.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The suite starts hundreds of Python processes: each would compile accord's modules again (and
# pytest re-rewrite every test module in each worker) if bytecode caches were not written. They go
# to __pycache__ folders, which git ignores.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup_env.sh
# the docs extra (MkDocs, Material, mkdocstrings; from PyPI), for tests/docs/test_docs_site.py, which
# builds the site in strict mode; optional: where it cannot be installed, those tests say so and skip
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[docs]' 2>&1 \
  | grep -v -E "^WARNING: Location .* is ignored" || true
status=0
# lint first: a finding fails the run, after every test has run and reported
if [ $# -eq 0 ]; then
  echo "== ruff check =="
  .venv/bin/python -m ruff check . || status=$?
fi
first=0
# The whole suite runs in two pytest-xdist workers, one test file per worker at a time (a file's
# module fixtures stay in one process): most tests wait on processes they start, so two files at
# once keep both cores busy. Named tests run in one process, as pytest runs them.
parallel=()
if [ $# -eq 0 ]; then
  parallel=(-n 2 --dist loadfile)
fi
.venv/bin/python -m pytest -p no:cacheprovider "${parallel[@]}" "$@" || first=$?
mxnet_args=()
if [ $# -eq 0 ]; then
  mxnet_args=(tests/with_mxnet)
else
  for arg in "$@"; do
    case "$arg" in tests/with_mxnet*) mxnet_args=("$@"); break ;; esac
  done
fi
# pytest's 5 is "no tests collected": what `test.sh tests/with_mxnet` gets in .venv, where those
# tests skip themselves (they run in .venv-mxnet below), so it is no failure there
if [ "$first" -ne 0 ] && ! { [ "$first" -eq 5 ] && [ ${#mxnet_args[@]} -gt 0 ]; }; then
  status=$first
fi
if [ ${#mxnet_args[@]} -gt 0 ]; then
  if .venv-mxnet/bin/python -c "import mxnet" >/dev/null 2>&1; then
    echo "== tests/with_mxnet in .venv-mxnet (MXNet 1.9.1, numpy 1.23.5) =="
    .venv-mxnet/bin/python -m pytest -p no:cacheprovider "${mxnet_args[@]}" || status=$?
  else
    echo "tests/with_mxnet: skipped: MXNet 1.9.1 is not installed in .venv-mxnet (see scripts/setup_env.sh's output)"
  fi
fi
exit $status
