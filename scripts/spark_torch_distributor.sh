#!/usr/bin/env bash
# Spark's TorchDistributor running an accord function (docs/spark.md): installs what it needs into
# its own venv, .venv-spark, on first use, then runs scripts/spark_torch_distributor.py, which
# exits 0 when 2 accord ranks under TorchDistributor(num_processes=2, local_mode=True) trained
# as one process does. Not part of CI: pyspark is a 456 MB download (490 MB installed, 80 s
# to build and install) and Spark needs a JVM (Debian's default-jre-headless: 44 MB, 189 MB
# installed, where the machine lacks one).
#
#   bash scripts/spark_torch_distributor.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v java >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq default-jre-headless) \
    >/dev/null 2>&1 || true
fi
command -v java >/dev/null 2>&1 || {
  echo "spark_torch_distributor: Spark needs a Java runtime; install one (apt-get install default-jre-headless)" >&2
  exit 1
}

[ -x .venv-spark/bin/python ] || python3 -m venv .venv-spark
.venv-spark/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e . 'pyspark[ml]>=3.4' 2>&1 \
  | grep -v -E "^WARNING: Location .* is ignored" || true
exec .venv-spark/bin/python scripts/spark_torch_distributor.py
