#!/bin/bash
# LoRA memory calibration on the GPU machine: scripts/calibrate_memory.py --lora-rank at 0.5B-7B on one GPU
# (fp32 base as verl's actor keeps it by default, and a bf16 base: fsdp_config.model_dtype=bf16), results
# under $OUT. The image has torch, transformers and peft; omegaconf comes as files:
#   pip install --no-deps --target .whl/site omegaconf==2.3.0 antlr4-python3-runtime==4.9.3
#   device run (carry .whl): bash scripts/gpu_calib_lora.sh
set -u
OUT=${OUT:-/tmp/calib_lora}; mkdir -p "$OUT"
[ -d .whl/site ] && export PYTHONPATH=$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -c "import peft, transformers, torch; print('peft', peft.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run() {
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  timeout "$limit" python3 scripts/calibrate_memory.py "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t ))s"; tail -5 "$OUT/$name.log"
}
run lora_0.5b_r32 60 --model qwen2.5-0.5b --worlds 1 --cases 1x512,4x2048,8x2048 --lora-rank 32
run lora_1.5b_r64 70 --model qwen2.5-1.5b --worlds 1 --cases 1x1024,4x1024,2x4096 --lora-rank 64
run lora_3b_r64 80 --model qwen2.5-3b --worlds 1 --cases 1x2048,4x2048 --lora-rank 64
run lora_7b_r32 120 --model qwen2.5-7b --worlds 1 --cases 1x1024,1x4096,2x4096 --lora-rank 32
run lora_7b_r32_bf16 110 --model qwen2.5-7b --worlds 1 --cases 1x1024,2x4096 --lora-rank 32 --model-dtype bf16
