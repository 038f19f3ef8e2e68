#!/bin/bash
# The caching allocator with and without expandable segments (verl 0.9's trainer runs its update phases with
# `expandable_segments:True`; scripts/calibration/calibrate_memory.py's earlier rows ran without): the same FSDP update
# cases both ways, one GPU, results under $OUT (omegaconf as files: see scripts/gpu/gpu_calib_env.sh).
#   device run (carry .whl): bash scripts/gpu/gpu_calib_alloc.sh [--edge]
#   --edge: the boundary, cases whose predicted live peak comes near the GPU's memory
set -u
OUT=${OUT:-/tmp/calib_alloc}
. scripts/gpu/gpu_calib_env.sh
for conf in expandable_segments:False expandable_segments:True; do
  tag=${conf#expandable_segments:}
  RUN_ENV=PYTORCH_CUDA_ALLOC_CONF=$conf
  if [ "${1:-}" = "--edge" ]; then
    run "3b_edge_$tag" 80 --model qwen2.5-3b --worlds 1 --cases 3x6144,5x4096
    run "1.5b_edge_$tag" 60 --model qwen2.5-1.5b --worlds 1 --cases 6x4096,7x4096
  else
    run "3b_$tag" 100 --model qwen2.5-3b --worlds 1 --cases 1x2048,4x2048,2x8192
    run "1.5b_$tag" 70 --model qwen2.5-1.5b --worlds 1 --cases 1x1024,4x1024,2x4096,8x4096
  fi
done
