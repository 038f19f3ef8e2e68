#!/usr/bin/env bash
# From a fresh clone: install, start this machine as a one-node Ray cluster, check it, plan the GSM8K PPO
# job for its GPUs (or for a stated hypothetical machine when it has none), and run the smoke job to SUCCEEDED.
#   bash scripts/quickstart.sh
# Stop the cluster afterwards with:  .venv/bin/verl-cluster down cluster_configs/local.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
vc=.venv/bin/verl-cluster
cluster=cluster_configs/local.yaml

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/4 verl-cluster up $cluster"
$vc up "$cluster"

step "2/4 verl-cluster check $cluster"
$vc check "$cluster"

step "3/4 verl-cluster plan launch/gsm8k.yaml"
if .venv/bin/python -c "import pynvml; pynvml.nvmlInit(); raise SystemExit(pynvml.nvmlDeviceGetCount() == 0)" 2>/dev/null; then
  $vc plan launch/gsm8k.yaml
else
  echo "(no NVIDIA GPU here: planning for a hypothetical 1 node x 8 x H100-80GB instead)"
  $vc plan launch/gsm8k.yaml --gpus 1x8xH100-80GB
fi

step "4/4 verl-cluster submit launch/smoke.yaml"
$vc submit launch/smoke.yaml

cat <<MSG

Done: the smoke job SUCCEEDED on the local cluster.
  status:  $vc status $cluster
  jobs:    $vc jobs $cluster
  stop:    $vc down $cluster
MSG
