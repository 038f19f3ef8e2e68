#!/usr/bin/env bash
# submit's verl config check on the GPU machine: the first answer (verl's trainer imported to validate) and the same
# job again (the answer kept in ~/.verl-cluster/cache/verl-probe). Needs the staged verl site (scripts/gpu/gpu_stage_verl.sh's
# calls); a home of its own and a tiny local model (validation reads the model's config.json; nothing downloaded).
#   bash scripts/gpu/gpu_probe_cache.sh [SITE]      # SITE: the staged site (default /root/stage/verl/site, else /srv/vc/site)
set -euo pipefail
cd "$(dirname "$0")/../.."
site=${1:-/root/stage/verl/site}
[ -d "$site" ] || site=/srv/vc/site   # gpu_multinode.py setup moves the staged site there
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH HF_HUB_OFFLINE=1
export HOME; HOME=$(mktemp -d)
python3 scripts/make_tiny_model.py -o "$HOME/tiny" >/dev/null
req=$(python3 - "$HOME/tiny" <<'EOF'
import json, sys
sys.path.insert(0, "scripts/calibration")
import grid2
words = [w for w in grid2.BY_NAME["g1fa-m8"].line()[3:] if not w.startswith("actor_rollout_ref.model.path=")]
print(json.dumps({"module": "verl.trainer.main_ppo", "overrides": words + [f"actor_rollout_ref.model.path={sys.argv[1]}"]}))
EOF
)
for i in 1 2; do
  start=$(date +%s%N)
  got=$(python3 verl_cluster/submit/verl_probe.py "$req" 2>/dev/null | grep '@@VC-JSON@@' || true)
  echo "probe $i: $(( ($(date +%s%N) - start) / 1000000 )) ms ${got#@@VC-JSON@@}"
done
