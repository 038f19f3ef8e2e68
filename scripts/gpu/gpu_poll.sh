#!/bin/bash
# Wait on the device machine for a run started detached there (e.g. `setsid nohup bash scripts/gpu/gpu_e2e.sh ... &`),
# never waiting on a machine that has nothing running:
#   bash scripts/gpu/gpu_poll.sh LOGS DONE_FILE [MAX_S]
# Exit 3 at once when LOGS is missing (a fresh machine: the run went with the machine that was given back), 0 when
# DONE_FILE exists, 2 when MAX_S (default 560) passed: call again at once — an idle machine goes back ~30 s after a
# call ends, so keep the gap between calls short. Every call copies what there is so far into $OUT (LOGS as a
# tarball, the product's run folders, a summary), so a machine that goes back mid-run loses nothing already seen.
set -u
LOGS=$1 DONE=$2 MAX_S=${3:-560}
OUT=${OUT:-/tmp/gpu_poll_out}
if [ ! -d "$LOGS" ]; then
  echo "nothing at $LOGS: a fresh machine (the run was lost with the previous one)"; exit 3
fi
t0=$(date +%s) rc=2
while [ $(( $(date +%s) - t0 )) -lt "$MAX_S" ]; do
  [ -e "$DONE" ] && { rc=0; break; }
  sleep 5
done
summary() {
  date -u +%FT%TZ
  cat "$LOGS/steps.log" 2>/dev/null
  for f in "$LOGS"/*/fault.json; do [ -f "$f" ] && echo "$f: $(cat "$f")"; done
  for f in ~/.verl-cluster/*/runs/*/events.jsonl; do
    [ -f "$f" ] || continue
    echo "== $f"
    python3 - "$f" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    print(e["time_iso"], e["class"], e["submission_id"][-8:], e["action"][:50], "|", e["evidence"][:220])
PY
  done
}
mkdir -p "$OUT"
summary | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
runs=$(ls -d ~/.verl-cluster/*/runs 2>/dev/null)
[ -n "$runs" ] && tar czf "$OUT/runs.tgz" $runs 2>/dev/null
exit $rc
