#!/usr/bin/env bash
# Build the documentation site into site/ with `mkdocs build --strict` (a broken link, a missing
# reference or a docstring warning fails the build). Installs the docs extra into .venv when it is
# missing (from PyPI). Extra arguments go to mkdocs build (`bash scripts/docs.sh --site-dir /tmp/s`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import mkdocs, material, mkdocstrings_handlers.python, accord" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[docs]' 2>&1 \
    | grep -v -E "^WARNING: Location .* is ignored" || true
fi
NO_MKDOCS_2_WARNING=1 exec .venv/bin/python -m mkdocs build --strict --site-dir site "$@"
