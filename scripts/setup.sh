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
# apt and the venvs' pip installs go side by side (each mostly waits on the network); each says how it ended
logs=$(mktemp -d -t vc-setup-XXXX); pids=(); names=()
step() {  # step NAME CMD...: run in the background, its output in $logs/NAME
  local name=$1; shift
  ( "$@" ) >"$logs/$name" 2>&1 & pids+=($!); names+=("$name")
}
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null
}
if [ -n "$missing" ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "installing system packages:$missing"
    step apt apt_install
  else
    echo "warning: not root; missing system packages:$missing (the namespace tests need them)" >&2
  fi
fi
py=${PYTHON:-python3}
venv_install() {  # venv_install DIR PIP-ARGS...
  local dir=$1; shift
  [ -x "$dir/bin/python" ] || "$py" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$dir/bin/python" -m pip install -q "$@"
}
if [ "$want_test" = 1 ]; then
  step venv venv_install .venv -e ".[test]" -r .ci/requirements-test.txt
  step venv-ray-old venv_install .venv-ray-old -e ".[test]" -r .ci/requirements-ray-oldest.txt
else
  step venv venv_install .venv -e .
fi
rc=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "setup step ${names[$i]} failed:" >&2; tail -n 30 "$logs/${names[$i]}" >&2; rc=1
  fi
done
rm -rf "$logs"
[ "$rc" = 0 ] || exit "$rc"
[ "$want_test" = 1 ] && echo "oldest supported Ray for the tests: $(.venv-ray-old/bin/python -c 'import ray; print(ray.__version__)')"
echo "ready: $(.venv/bin/verl-cluster --version)"
