# Sourced by scripts/gpu/gpu_calib_*.sh on the GPU machine: the environment those calibrations run in and `run NAME
# LIMIT ARGS...`, which runs scripts/calibration/calibrate_memory.py ARGS under `timeout LIMIT` (with $RUN_ENV, e.g.
# PYTORCH_CUDA_ALLOC_CONF=..., in its environment), keeps NAME.json/NAME.log under $OUT and prints the table's tail.
# omegaconf comes as files: pip install --no-deps --target .whl/site omegaconf==2.3.0 antlr4-python3-runtime==4.9.3
mkdir -p "$OUT"
[ -d .whl/site ] && export PYTHONPATH=$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
RUN_ENV=${RUN_ENV:-}
run() {
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  env $RUN_ENV timeout "$limit" python3 scripts/calibration/calibrate_memory.py "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t ))s"; tail -5 "$OUT/$name.log"
}
