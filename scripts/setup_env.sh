#!/usr/bin/env bash
# Create or refresh .venv with accord and everything its tests and examples use.
# Sourced by main_job.sh and test.sh; safe to run again (pip skips what is already there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# From Debian (optional: the tests that need them skip without them):
# - Open MPI for the mpi backend and the mpirun tests;
# - openssh-server/client, iproute2 (ip, tc) and rsync for the simulated cluster of tests/cluster
#   (network namespaces with their own sshd; see docs/simulated-cluster.md). Installing
#   openssh-server starts no daemon in a container; the tests run their own sshd per host.
need=()
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v tc >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
# - slurm-wlm and munge for tests/cluster/test_cluster_slurm.py, which runs its own munged,
#   slurmctld and one slurmd per simulated host (the packages' services are not started)
[ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] || need+=(slurm-wlm munge)
# - Chromium, headless, for tests/docs/test_docs_site.py: it opens the built docs site as a reader would
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
  # no service may start on install (a system sshd on port 22): a policy-rc.d that says no,
  # only for the time of the install and only where the machine has none
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ] && [ "$(id -u)" -eq 0 ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
  fi
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}") >/dev/null 2>&1 \
    || echo "setup: could not install ${need[*]}; the tests that need them will be skipped" >&2
  if [ -n "$policy" ]; then rm -f "$policy"; fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# torch is pinned to the CPU build for tests here; the package itself accepts torch>=2.4.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[dev]' 2>&1 \
  | grep -v -E "^WARNING: Location .* is ignored" || true
.venv/bin/python -c "import accord, torch" || { echo "setup: installation failed" >&2; exit 1; }
# The ray extra, for accord.ray's tests (docs/ray.md): about 145 MB of downloads (ray 79 MB,
# pyarrow 55 MB), 515 MB installed and 40 s on the first run; later runs find it installed.
# Optional: where it cannot be installed, those tests are skipped with the reason.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[ray]' 2>&1 \
  | grep -v -E "^WARNING: Location .* is ignored" || true
.venv/bin/python -c "import ray" >/dev/null 2>&1 \
  || echo "setup: Ray could not be installed in .venv; accord.ray's tests will be skipped" >&2
# The lightning and accelerate extras, and the lightning package (Lightning's other import name),
# for the tests of docs/lightning.md and docs/accelerate.md: about 13 MB of wheels, 68 MB
# installed, 25 s on the first run. Optional: where they cannot be installed, those tests are
# skipped with the reason.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[lightning,accelerate]' \
    'lightning>=2.6,<2.7' 2>&1 | grep -v -E "^WARNING: Location .* is ignored" || true
.venv/bin/python -c "import pytorch_lightning, lightning, accelerate" >/dev/null 2>&1 \
  || echo "setup: Lightning or Accelerate could not be installed in .venv; their tests will be skipped" >&2

# MXNet 1.9.1 needs numpy 1.23.5 (it uses np.bool): a second venv, so that pin never reaches
# .venv. scripts/test.sh runs tests/with_mxnet there; examples/kvstore_bench.py and
# benchmarks/mxnet_trainer.py take its python. If MXNet cannot be installed, its tests are
# skipped (with the reason) and everything else still runs.
[ -x .venv-mxnet/bin/python ] || python3 -m venv .venv-mxnet || true
if [ -x .venv-mxnet/bin/python ]; then
  .venv-mxnet/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 \
      -e '.[mxnet,ps,examples]' 'pytest>=8' 'pytest-timeout>=2.3' cloudpickle 2>&1 \
    | grep -v -E "^WARNING: Location .* is ignored" || true
  .venv-mxnet/bin/python -c "import mxnet, torch, accord.mxnet" >/dev/null 2>&1 \
    || echo "setup: MXNet 1.9.1 could not be installed in .venv-mxnet; its tests will be skipped" >&2
fi
