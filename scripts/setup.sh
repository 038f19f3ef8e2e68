#!/usr/bin/env bash
# Install what verl-cluster needs on this machine: system tools (as root), a venv at .venv, the project.
#   bash scripts/setup.sh           # for using it
#   bash scripts/setup.sh --test    # plus test dependencies (torch CPU, pyarrow, hypothesis, ...), and
#                                   # .venv-ray-old: the project on the oldest supported Ray
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0; [ "${1:-}" = "--test" ] && want_test=1
apt_pkgs="openssh-server openssh-client iproute2 ucx-utils iperf3 iputils-ping procps nftables iptables rsync util-linux"
# a real Slurm for tests/integration/test_slurm.py (slurmctld + slurmd per namespace host, munge)
[ "$want_test" = 1 ] && apt_pkgs="$apt_pkgs slurmctld slurmd slurm-client munge"
missing=""
for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "installing system packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "warning: not root; missing system packages:$missing (the namespace tests need them)" >&2
  fi
fi
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [ "$want_test" = 1 ]; then
  # torch CPU for the torchrun/gloo tests; the pinned version resolves to the machine's local CPU build
  .venv/bin/python -m pip install -q -e ".[test]" -r .ci/requirements-test.txt
  # a second venv with the oldest supported Ray: test.sh runs the integration tests on it too
  [ -x .venv-ray-old/bin/python ] || "$py" -m venv .venv-ray-old
  .venv-ray-old/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv-ray-old/bin/python -m pip install -q -e ".[test]" -r .ci/requirements-ray-oldest.txt
  echo "oldest supported Ray for the tests: $(.venv-ray-old/bin/python -c 'import ray; print(ray.__version__)')"
else
  .venv/bin/python -m pip install -q -e .
fi
echo "ready: $(.venv/bin/verl-cluster --version)"
