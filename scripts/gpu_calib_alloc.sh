#!/bin/bash
# The caching allocator with and without expandable segments (verl 0.9's trainer runs its update phases with
# `expandable_segments:True`; scripts/calibrate_memory.py's earlier rows ran without): the same FSDP update
# cases both ways, one GPU, results under $OUT. omegaconf comes as files, as for gpu_calib_lora.sh:
#   pip install --no-deps --target .whl/site omegaconf==2.3.0 antlr4-python3-runtime==4.9.3
#   device run (carry .whl): bash scripts/gpu_calib_alloc.sh [--edge]
set -u
OUT=${OUT:-/tmp/calib_alloc}; mkdir -p "$OUT"
[ -d .whl/site ] && export PYTHONPATH=$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run() {
  local name=$1 limit=$2 conf=$3; shift 3
  local t=$(date +%s)
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$limit" python3 scripts/calibrate_memory.py "$@" --out "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t ))s"; tail -5 "$OUT/$name.log"
}
for conf in expandable_segments:False expandable_segments:True; do
  [ "${1:-}" = "--edge" ] && break
  tag=${conf#expandable_segments:}
  run "3b_$tag" 100 "$conf" --model qwen2.5-3b --worlds 1 --cases 1x2048,4x2048,2x8192
  run "1.5b_$tag" 70 "$conf" --model qwen2.5-1.5b --worlds 1 --cases 1x1024,4x1024,2x4096,8x4096
done
# the boundary: cases whose predicted live peak comes near the GPU's memory (--edge)
[ "${1:-}" = "--edge" ] || exit 0
for conf in expandable_segments:False expandable_segments:True; do
  tag=${conf#expandable_segments:}
  run "3b_edge_$tag" 80 "$conf" --model qwen2.5-3b --worlds 1 --cases 3x6144,5x4096
  run "1.5b_edge_$tag" 60 "$conf" --model qwen2.5-1.5b --worlds 1 --cases 6x4096,7x4096
done
