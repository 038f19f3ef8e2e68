#!/bin/bash
# LoRA memory calibration on the GPU machine: scripts/calibration/calibrate_memory.py --lora-rank at 0.5B-7B on one GPU
# (fp32 base as verl's actor keeps it by default, and a bf16 base: fsdp_config.model_dtype=bf16), results
# under $OUT. The image has torch, transformers and peft; omegaconf comes as files (scripts/gpu/gpu_calib_env.sh).
#   device run (carry .whl): bash scripts/gpu/gpu_calib_lora.sh
set -u
OUT=${OUT:-/tmp/calib_lora}
. scripts/gpu/gpu_calib_env.sh
python3 -c "import peft; print('peft', peft.__version__)"
run lora_0.5b_r32 60 --model qwen2.5-0.5b --worlds 1 --cases 1x512,4x2048,8x2048 --lora-rank 32
run lora_1.5b_r64 70 --model qwen2.5-1.5b --worlds 1 --cases 1x1024,4x1024,2x4096 --lora-rank 64
run lora_3b_r64 80 --model qwen2.5-3b --worlds 1 --cases 1x2048,4x2048 --lora-rank 64
run lora_7b_r32 120 --model qwen2.5-7b --worlds 1 --cases 1x1024,1x4096,2x4096 --lora-rank 32
run lora_7b_r32_bf16 110 --model qwen2.5-7b --worlds 1 --cases 1x1024,2x4096 --lora-rank 32 --model-dtype bf16
