#!/bin/bash
# End to end on the GPU machine: facts, up/status/check/plan/submit gpu_smoke/down, NCCL bench, memory
# calibration, and real verl runs. Run from the repo root there (device `run`, after `../shared/tools/gpu-bundle.sh`
# here, or after staging verl's wheels with scripts/gpu/gpu_stage_verl.sh, which brings Ray too):
#   bash scripts/gpu/gpu_e2e.sh [STEP ...]      # steps: env facts cluster calib (default: all, in that order)
#   bash scripts/gpu/gpu_e2e.sh fa verlenv verldata up ppo grpo ppo05 reject down  # verl for real (see below)
#   bash scripts/gpu/gpu_e2e.sh fa verlenv verldata up ppo2 ppo052 down            # on 2 GPUs
#   bash scripts/gpu/gpu_e2e.sh verldata up learn down   # the second plan of a line starts from the first's host speed
#   bash scripts/gpu/gpu_e2e.sh verldata up watch-kill watch-hang watch-refused watch-argv watch-script  # --watch
#   bash scripts/gpu/gpu_e2e.sh fa griddata up-only pcie grid-a # the planner's calibration grid (grid-b: the hold-out)
# Every step logs to $LOGS/<n>-<name>.log (time, exit code in $LOGS/steps.log) and failures do not stop the run;
# after each step $OUT/e2e.tgz is refreshed, so whatever ran comes back even when the call is cut short.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 ...): the host's GPUs are shared.
set -u
OUT=${OUT:-/tmp/gpu_e2e_out}
LOGS=${LOGS:-/tmp/e2e}
BUDGET_S=${BUDGET_S:-500}   # stop starting new steps after this many seconds
mkdir -p "$OUT" "$LOGS"
T0=$(date +%s)
SITE=/tmp/site
if [ -d /root/stage/verl/site ]; then SITE=/root/stage/verl/site   # staged verl + vLLM + Ray wheels
elif [ -f .gpubundle/site.tar.xz ] && [ ! -d /tmp/site ]; then tar xJf .gpubundle/site.tar.xz -C /tmp; fi
# a machine given back between calls comes back bare: say so at once rather than fail every step on imports
[ -d "$SITE" ] || { echo "nothing staged at /root/stage/verl/site or $SITE: a fresh machine? stage first" | tee -a "$LOGS/steps.log"; exit 3; }
export PYTHONPATH=$SITE:$PWD PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RAY_USAGE_STATS_ENABLED=0 VLLM_USE_FLASHINFER_SAMPLER=0   # flashinfer is not staged
ulimit -n 65536 2>/dev/null || true   # doctor's fix hint for Ray (the machine starts at 20000)
# The product starts `ray` from beside the node's Python (ray.ray_executable defaults to <python's bin>/ray);
# the bundle's `ray` lives in /tmp/site/bin, so link it there the way a real install would have it.
PYBIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
# -f: a link left dangling by an earlier run without the staged site (-e is false for it) is replaced
[ -e "$PYBIN/ray" ] || ln -sf $SITE/bin/ray "$PYBIN/ray" 2>/dev/null || echo "cannot link ray into $PYBIN"
N=0
pack() { tar czf "$OUT/e2e.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null; cp "$LOGS/steps.log" "$OUT/steps.log" 2>/dev/null; }
# step NAME TIMEOUT_S CMD...   (stdout+stderr -> log; a JSON-ish stdout also kept as NAME.out)
step() {
  local name=$1 limit=$2; shift 2
  N=$((N + 1))
  local elapsed=$(( $(date +%s) - T0 ))
  if [ $((elapsed + 5)) -ge "$BUDGET_S" ]; then
    echo "$(printf %02d $N)-$name SKIPPED (budget: ${elapsed}s used of ${BUDGET_S}s)" | tee -a "$LOGS/steps.log"; return
  fi
  [ $((elapsed + limit)) -gt "$BUDGET_S" ] && limit=$((BUDGET_S - elapsed))
  local log="$LOGS/$(printf %02d $N)-$name"
  echo "\$ $*" > "$log.log"
  local s=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" > "$log.out" 2>> "$log.log"
  local rc=$?
  local dt=$(python3 -c "print(round($(date +%s.%N) - $s, 2))")
  echo "$(printf %02d $N)-$name rc=$rc ${dt}s (limit ${limit}s)" | tee -a "$LOGS/steps.log"
  pack
}
want() { [ ${#STEPS[@]} -eq 0 ] && return 0; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
# the calibration grid's two batches (below, "calibration grid") expand to their runs
GRID_A=(fit-grpo15 fit-offload05 fit-n8long05 fit-ppo15)   # most needed first: the last may not fit the machine
GRID_B=(fit-grpo3 fit-offload15 fit-ppo05 hold-padded05)    # run as hold-outs; the first three shaped the model
GRID_C=(hold-ppo15off hold-grpo3n8 hold-grpo05wide)         # the hold-outs run after that
GRID_D=(fit-grpo3big hold-grpo15big)  # compute-heavy (update FLOPs over half the phase): the share of peak FLOPs
STEPS=()
for s in "$@"; do
  case $s in grid-a) STEPS+=("${GRID_A[@]}") ;; grid-b) STEPS+=("${GRID_B[@]}") ;; grid-c) STEPS+=("${GRID_C[@]}") ;;
    grid-d) STEPS+=("${GRID_D[@]}") ;; *) STEPS+=("$s") ;; esac
done
named() { for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }  # only when asked for

if want env; then
  step nvidia-smi 20 nvidia-smi
  step topo 20 nvidia-smi topo -m
  step versions 60 python3 -c "
import sys, torch, importlib
print('python', sys.version.split()[0], sys.executable)
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())
print('p2p 0<->1', torch.cuda.can_device_access_peer(0, 1) if torch.cuda.device_count() > 1 else None)
for m in ('transformers', 'ray', 'verl', 'flash_attn', 'vllm', 'sglang', 'pynvml', 'omegaconf', 'paramiko', 'rich', 'tensordict', 'hydra', 'codetiming', 'datasets', 'peft', 'accelerate', 'pandas', 'pyarrow'):
    try:
        mod = importlib.import_module(m); print(m, getattr(mod, '__version__', '?'))
    except Exception as e:
        print(m, 'MISSING', type(e).__name__, str(e).splitlines()[0][:150] if str(e) else '')
"
  step which-ip 10 bash -c 'command -v ip || echo "no ip command"; uname -r; nproc; free -g'
fi

if want facts; then
  step doctor 120 python3 -m verl_cluster doctor --json
  step record-facts 120 python3 scripts/calibration/record_facts.py --note "${FACTS_NOTE:-device machine, recorded by scripts/gpu/gpu_e2e.sh}"
fi

if want cluster; then
  step up 180 python3 -m verl_cluster up cluster_configs/local.yaml
  step status 60 python3 -m verl_cluster status cluster_configs/local.yaml --json
  step status-table 60 python3 -m verl_cluster status cluster_configs/local.yaml
  step check 240 python3 -m verl_cluster check cluster_configs/local.yaml --json
  step check-table 240 python3 -m verl_cluster check cluster_configs/local.yaml
  step plan-gsm8k 60 python3 -m verl_cluster plan launch/gsm8k.yaml --json
  step plan-gsm8k-table 60 python3 -m verl_cluster plan launch/gsm8k.yaml
  step plan-gpu-smoke 60 python3 -m verl_cluster plan launch/gpu_smoke.yaml
  step bench-nccl 180 python3 scripts/bench/bench_nccl.py cluster_configs/local.yaml --rounds 2 --out "$LOGS/bench_nccl.json"
  step submit-gpu-smoke 300 python3 -m verl_cluster submit launch/gpu_smoke.yaml "env.VC_REPO=$PWD" env.GPU_SMOKE_STRATEGY=split
  step submit-smoke 120 python3 -m verl_cluster submit launch/smoke.yaml
  step down 120 python3 -m verl_cluster down cluster_configs/local.yaml
fi

if want calib; then
  step calib-0.5b 200 python3 scripts/calibration/calibrate_memory.py --model qwen2.5-0.5b --worlds 1,2 \
       --cases 1x512,4x512,8x512,1x2048,4x2048,8x2048 --out "$LOGS/calib_0.5b.json"
  step calib-1.5b 200 python3 scripts/calibration/calibrate_memory.py --model qwen2.5-1.5b --worlds 1,2 \
       --cases 1x1024,4x1024,2x4096 --out "$LOGS/calib_1.5b.json"
fi

# ---- verl for real: tiny and full-size random-init Qwen2.5 models, synthetic GSM8K, vLLM rollout ----
MODELS=/root/models DATA=/root/data/gsm8k CKPT=/root/ckpt
VC="python3 -m verl_cluster"
# run_verl NAME JOB.yaml [key=value ...]: plan, then submit --json (logs on stderr) while NVML is sampled per
# process and each log line is stamped with the time it appeared (to line memory up with verl's phases)
run_verl() {
  local name=$1 job=$2; shift 2
  # the calibrated hosts' plan (what calib_from_runs.py replays), unless HOST_FACTOR says otherwise (the learn step)
  set -- "$@" "placement.host_factor=${HOST_FACTOR:-off}"
  local a planargs=(); for a in "$@"; do [ "$a" = --skip-preflight ] || planargs+=("$a"); done
  step "plan-$name" 90 $VC plan "$job" "${planargs[@]}" --json
  cp "$LOGS/$(printf %02d $N)-plan-$name.out" "$LOGS/plan-$name.json" 2>/dev/null
  python3 scripts/gpu/gpu_mem_sampler.py "$LOGS/nvml-$name.jsonl" --stop-file "$LOGS/stop-$name" \
    --log "$LOGS/$(printf %02d $((N + 1)))-submit-$name.log" --log-out "$LOGS/log-$name.txt" &
  # --no-gc-freeze: these runs feed the step-time fit (calib_from_runs.py), whose runs had the collector as verl has it
  step "submit-$name" "${RUN_LIMIT:-480}" $VC submit "$job" "$@" --no-gc-freeze --json
  touch "$LOGS/stop-$name"; wait
  ls -R "$CKPT/$name" 2>/dev/null | head -40 > "$LOGS/ckpt-$name.txt"
  pack
}
COMMON=(data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" env.VLLM_LOGGING_LEVEL=INFO env.VLLM_USE_FLASHINFER_SAMPLER=0
        trainer.total_training_steps=3 trainer.test_freq=3 trainer.save_freq=3 trainer.val_before_train=false)
if named verlenv; then
  step imports 240 python3 -c "
import importlib, time
for m in ('ray', 'transformers', 'flash_attn', 'vllm', 'verl', 'verl.trainer.main_ppo', 'transfer_queue', 'vllm.entrypoints.openai.api_server',
          'vllm.v1.engine.async_llm', 'verl.workers.rollout.vllm_rollout.vllm_async_server', 'verl.workers.engine_workers'):
    t = time.time()
    try:
        mod = importlib.import_module(m); print('ok', m, getattr(mod, '__version__', ''), round(time.time() - t, 1))
    except Exception as e:
        print('FAIL', m, type(e).__name__, str(e)[:300])
"
fi
# flash-attn (verl 0.9.1 loads the critic with flash_attention_2): the wheel built here by
# `scripts/gpu/gpu_flash_attn_kit.sh --wheel-here` and carried in .stage/flashattn-wheel; installed beside verl, checked
named fa && step flash-attn 180 env FA_SITE=$SITE bash .stage/flashattn-wheel/install.sh
if named verldata; then
  step model-tiny 120 python3 scripts/make_tiny_model.py -o $MODELS/tiny
  step model-0.5b 300 python3 scripts/make_tiny_model.py --shape qwen2.5-0.5b -o $MODELS/qwen2.5-0.5b
  step data 120 python3 scripts/prepare_gsm8k.py --synthetic 2000 --test-rows 64 -o $DATA
fi
named up && step up 180 $VC up cluster_configs/local.yaml && step check 240 $VC check cluster_configs/local.yaml
named ppo && run_verl ppo launch/gsm8k.yaml model.path=$MODELS/tiny "${COMMON[@]}" data.train_batch_size=16 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.default_local_dir=$CKPT/ppo
named grpo && run_verl grpo launch/gsm8k_grpo.yaml model.path=$MODELS/tiny "${COMMON[@]}" data.train_batch_size=16 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.default_local_dir=$CKPT/grpo
named ppo05 && run_verl ppo05 launch/gsm8k.yaml model.path=$MODELS/qwen2.5-0.5b "${COMMON[@]}" data.train_batch_size=64 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 trainer.default_local_dir=$CKPT/ppo05
named grpo05 && run_verl grpo05 launch/gsm8k_grpo.yaml model.path=$MODELS/qwen2.5-0.5b "${COMMON[@]}" data.train_batch_size=64 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 trainer.default_local_dir=$CKPT/grpo05
# the plan learns the machine's host speed (placement.host_factor: auto): the same line twice from an empty store;
# the second plan starts from the first run's host fit (its note: "host factor X from run on these machines")
if named learn; then
  mv -f "$HOME/.verl-cluster/host_speed.json" "$HOME/.verl-cluster/host_speed.json.before-learn" 2>/dev/null
  for r in learn-a learn-b; do
    HOST_FACTOR=auto run_verl $r launch/gsm8k_grpo.yaml model.path=$MODELS/qwen2.5-0.5b "${COMMON[@]}" data.train_batch_size=64 \
      actor_rollout_ref.actor.ppo_mini_batch_size=32 trainer.total_training_steps=5 trainer.default_local_dir=$CKPT/$r
  done
  step learn-store 10 cat "$HOME/.verl-cluster/host_speed.json"
fi
# 2 GPUs: every role on both GPUs (verl.trainer.main_ppo has one resource pool, so the plan never splits it)
named ppo2 && run_verl ppo2 launch/gsm8k.yaml model.path=$MODELS/tiny "${COMMON[@]}" data.train_batch_size=16 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.default_local_dir=$CKPT/ppo2
named ppo052 && run_verl ppo052 launch/gsm8k.yaml model.path=$MODELS/qwen2.5-0.5b "${COMMON[@]}" data.train_batch_size=64 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 trainer.default_local_dir=$CKPT/ppo052
# a configuration the plan rejects, run anyway (--skip-preflight) to see verl fail or the margin: REJECT="k=v ..."
named reject && run_verl reject launch/gsm8k_grpo.yaml model.path=$MODELS/qwen2.5-0.5b "${COMMON[@]}" \
  trainer.default_local_dir=$CKPT/reject ${REJECT:-} --skip-preflight
# ---- --watch on real verl: a tiny GRPO run (4 steps, checkpoint every 2) faulted at a chosen point ----
# Each case: scripts/gpu/gpu_watch_case.py runs the submit, injects the fault (scripts/gpu/gpu_fault.py), keeps the run
# folder, every attempt's log, Ray's actor table and processes over time, and writes figures.json.
WCK=$CKPT/watch
WARGS=(data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" data.train_batch_size=16
       actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.rollout.n=2
       actor_rollout_ref.rollout.gpu_memory_utilization=0.3 trainer.total_training_steps=4 trainer.save_freq=2
       trainer.test_freq=-1 trainer.val_before_train=false actor_rollout_ref.rollout.enforce_eager=true)
WJOB=(launch/gsm8k_grpo.yaml model.path=$MODELS/tiny env.VLLM_USE_FLASHINFER_SAMPLER=0 watch.backoff_s=2 "${WARGS[@]}")
KILL="--after-file CKPT/global_step_2/actor --delay 2 --signal KILL --match ray::WorkerDict"
wcase() {  # wcase NAME LIMIT FAULT [FAULT ...] -- COMMAND...   (faults one after another; "" for none)
  local name=$1 limit=$2; shift 2
  local faults=() f
  while [ "$1" != -- ]; do [ -n "$1" ] && faults+=(--fault "${1//CKPT/$WCK/$name}"); shift; done; shift
  rm -rf "$WCK/$name"
  local left=$(( BUDGET_S - ($(date +%s) - T0) - 25 ))  # the case ends (and keeps its files) before the step's cut
  [ "$left" -lt $((limit - 20)) ] || left=$((limit - 20))
  step "watch-$name" "$limit" python3 scripts/gpu/gpu_watch_case.py "$LOGS/watch-$name" --timeout "$left" \
    "${faults[@]}" -- "$@"
  cat "$LOGS/watch-$name/figures.json" 2>/dev/null | tee -a "$LOGS/steps.log"
  pack
}
# (a) a worker SIGKILLed 2 s after global_step_2 appeared (the node stays up): resumed from step 2, SUCCEEDED
named watch-kill && wcase kill 900 "$KILL" -- $VC submit "${WJOB[@]}" trainer.default_local_dir=$WCK/kill --watch
# (b) a worker SIGSTOPped during step 3: hang detected, bundle collected (py-spy), resumed, SUCCEEDED
named watch-hang && wcase hang 900 "--after-file CKPT/global_step_2/actor --delay 4 --signal STOP --match ray::WorkerDict" \
  -- $VC submit "${WJOB[@]}" trainer.default_local_dir=$WCK/hang watch.hang_after=${HANG_AFTER:-75s} --watch
# (c) an override verl's Hydra refuses (preflight skipped so it reaches verl): not retried, exit 1, the error shown
named watch-refused && wcase refused 240 "" -- $VC submit "${WJOB[@]}" trainer.default_local_dir=$WCK/refused \
  actor_rollout_ref.actor.no_such_key=1 --skip-preflight --watch
# (d) the command-line form and a verl script, through (a)
VERL_ARGV=(python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.max_prompt_length=512
  data.max_response_length=1024 actor_rollout_ref.model.path=$MODELS/tiny actor_rollout_ref.actor.use_kl_loss=true
  actor_rollout_ref.rollout.name=vllm trainer.logger=[console] trainer.nnodes=1 trainer.n_gpus_per_node=1 "${WARGS[@]}")
named watch-argv && wcase argv 900 "$KILL" -- $VC submit watch.backoff_s=2 --watch -- "${VERL_ARGV[@]}" \
  trainer.default_local_dir=$WCK/argv
# (d) a verl script as is (submit run.sh), 6 steps: a worker SIGSTOPped in step 3 (hang, as (b)), then one
# SIGKILLed in step 5 (as (a)): two restarts, resumed from step 2 and then from step 4
if named watch-script; then
  mkdir -p /root/scripts
  { echo '#!/bin/bash'; echo 'set -x'; printf '%q ' "${VERL_ARGV[@]/total_training_steps=4/total_training_steps=6}" \
      trainer.default_local_dir=$WCK/script; echo '"$@"'; } > /root/scripts/run_tiny_grpo.sh
  wcase script 1500 "--after-file CKPT/global_step_2/actor --delay 4 --signal STOP --match ray::WorkerDict" \
    "--after-file CKPT/global_step_4/actor --delay 2 --signal KILL --match ray::WorkerDict --timeout 1500" \
    -- $VC submit /root/scripts/run_tiny_grpo.sh watch.backoff_s=2 watch.hang_after=${HANG_AFTER:-120s} --watch
fi
# ---- calibration grid: the planner's host RAM and step time against real verl runs, one H100 ----
# bash scripts/gpu/gpu_e2e.sh fa griddata up-only pcie grid-a   (grid-b, grid-c: one 30-minute machine each)
# Every run: random-init Qwen2.5 shape, synthetic GSM8K, 5 steps (step 1 is left out of timing; batch A had 3, and
# step 2 was still warming up by up to 0.65 s a phase), no validation,
# planned first, NVML + host RAM per process role sampled (scripts/gpu/gpu_mem_sampler.py), log kept; then
# `python3 scripts/calibration/calib_from_runs.py $LOGS NAME` turns it into a calibration fixture. flash-attn (step `fa`, head
# dims 32/64/128) is installed on every batch, so the plan picks packed flash-attn unless a run pins otherwise.
# Expected seconds: measured on the H100 (2026-11-25/26): submit to exit 245-401 s a run (the 3B n=8 one 295 s);
# fa + models + up + pcie ~2 min, staging ~1 min. A run that would not finish inside BUDGET_S is skipped (named in
# steps.log).
# A: fit (with the recorded GRPO 0.5B, GRPO tiny and PPO 0.5B runs) | B: run held out; the 3B, offload and PPO runs
# shaped the model (PCIe rate, offloaded update_weights, GAE, the critic's tokens) and joined the fit |
# C: held out after that (critic offload, 3B with n=8 and long responses, 256 short sequences)
FIT=(data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" env.VLLM_LOGGING_LEVEL=INFO
     env.VLLM_USE_FLASHINFER_SAMPLER=0 trainer.total_training_steps=5 trainer.test_freq=-1 trainer.val_before_train=false)
GRPO=launch/gsm8k_grpo.yaml PPO=launch/gsm8k.yaml
OFFLOAD="actor_rollout_ref.actor.fsdp_config.param_offload=true actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"
declare -A G_SHAPE G_JOB G_ARGS G_EXPECT_S
grid_run() { G_SHAPE[$1]=$2; G_JOB[$1]=$3; G_EXPECT_S[$1]=$4; G_ARGS[$1]=$5; }
#        name           shape         job    ~s   batch x n, lengths, what varies
grid_run fit-grpo15     qwen2.5-1.5b  $GRPO  350  "data.train_batch_size=16 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.save_freq=-1"
grid_run fit-ppo15      qwen2.5-1.5b  $PPO   320  "data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.rollout.gpu_memory_utilization=0.35 trainer.save_freq=-1"
grid_run fit-offload05  qwen2.5-0.5b  $GRPO  330  "data.train_batch_size=32 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=16 $OFFLOAD trainer.save_freq=-1"
grid_run fit-n8long05   qwen2.5-0.5b  $GRPO  360  "data.train_batch_size=16 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 data.max_response_length=2048 trainer.save_freq=-1"
grid_run fit-grpo3      qwen2.5-3b    $GRPO  410  "data.train_batch_size=8 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.rollout.gpu_memory_utilization=0.35 trainer.save_freq=-1"
grid_run fit-offload15  qwen2.5-1.5b  $GRPO  360  "data.train_batch_size=8 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=4 data.max_response_length=512 $OFFLOAD trainer.save_freq=-1"
grid_run fit-ppo05      qwen2.5-0.5b  $PPO   380  "data.train_batch_size=128 actor_rollout_ref.actor.ppo_mini_batch_size=64 data.max_response_length=1024 trainer.save_freq=3"
grid_run hold-padded05  qwen2.5-0.5b  $GRPO  310  "data.train_batch_size=16 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.model.use_remove_padding=false +actor_rollout_ref.model.override_config.attn_implementation=sdpa trainer.save_freq=-1"
# batch C: what batch B did not vary (critic offload, a 3B with n=8 and long responses, 256 short sequences)
grid_run hold-ppo15off  qwen2.5-1.5b  $PPO   400  "data.train_batch_size=32 actor_rollout_ref.actor.ppo_mini_batch_size=16 data.max_response_length=768 $OFFLOAD critic.fsdp.param_offload=true critic.fsdp.optimizer_offload=true trainer.save_freq=-1"
grid_run hold-grpo3n8   qwen2.5-3b    $GRPO  430  "data.train_batch_size=4 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=1024 actor_rollout_ref.rollout.gpu_memory_utilization=0.35 trainer.save_freq=-1"
grid_run hold-grpo05wide qwen2.5-0.5b $GRPO  330  "data.train_batch_size=64 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=32 data.max_response_length=256 trainer.save_freq=-1"
# batch D: many long sequences, so FLOPs set the update's time (the fit's only hold on COMPUTE_SHARE)
grid_run fit-grpo3big   qwen2.5-3b    $GRPO  450  "data.train_batch_size=32 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=16 data.max_response_length=1024 actor_rollout_ref.rollout.gpu_memory_utilization=0.35 trainer.save_freq=-1"
grid_run hold-grpo15big qwen2.5-1.5b  $GRPO  470  "data.train_batch_size=64 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=32 data.max_response_length=1024 trainer.save_freq=-1"
grid_named() { local s; for s in "${STEPS[@]}"; do [ -n "${G_SHAPE[$s]:-}" ] && echo "$s"; done; }
if named griddata; then   # the shapes the named runs use (written side by side), the data, and the staged
  # packages' bytecode (installed --no-compile: otherwise the first run's every process compiles what it imports)
  shapes=$(for s in $(grid_named); do echo "${G_SHAPE[$s]}"; done | sort -u)
  step grid-models 300 bash -c "for m in $(echo $shapes); do [ -f $MODELS/\$m/model.safetensors ] || python3 scripts/make_tiny_model.py --shape \$m -o $MODELS/\$m & done; python3 -m compileall -q -j 0 $SITE >/dev/null 2>&1 & wait"
  [ -f $DATA/train.parquet ] || step data 120 python3 scripts/prepare_gsm8k.py --synthetic 2000 --test-rows 64 -o $DATA
fi
named up-only && step up 180 $VC up cluster_configs/local.yaml
# host <-> GPU copy rate (the step-time model's PCIE_GBS: the ref's per-micro-batch upload, offload traffic)
named pcie && step pcie 90 python3 scripts/gpu/gpu_pcie_copy.py
for name in $(grid_named); do
  left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ "$left" -lt "${G_EXPECT_S[$name]}" ]; then
    echo "$name SKIPPED (needs ~${G_EXPECT_S[$name]}s, ${left}s left of BUDGET_S)" | tee -a "$LOGS/steps.log"; continue
  fi
  # shellcheck disable=SC2086  # G_ARGS holds key=value words without spaces
  RUN_LIMIT=$(( G_EXPECT_S[$name] + 180 )) run_verl "$name" "${G_JOB[$name]}" model.path=$MODELS/${G_SHAPE[$name]} \
    "${FIT[@]}" ${G_ARGS[$name]} trainer.default_local_dir=$CKPT/$name
  rm -rf "${CKPT:?}/$name"   # a 1.5B checkpoint is ~18 GB: the disk is 64 GB
done
named down && step down 120 $VC down cluster_configs/local.yaml

if [ -n "${EXTRA:-}" ]; then step extra 300 bash -c "$EXTRA"; fi
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$LOGS/steps.log"
pack
