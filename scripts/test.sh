#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine and run the whole test suite (what CI runs).
# Needs root for apt and for the network-namespace hosts of the integration tests.
#   bash scripts/test.sh            # everything: all tests on the newest supported Ray, then the Ray-version
#                                   # dependent integration tests on the oldest (.venv-ray-old; VC_OLDEST_RAY=0 skips it)
#   bash scripts/test.sh -k config  # extra args go to pytest (both passes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export VC_REQUIRE_INTEGRATION=${VC_REQUIRE_INTEGRATION:-1}  # missing prerequisites fail, never skip silently

# pytest with one venv's Python: the namespace hosts run the `ray` beside it, and the other venv's Ray is the
# other supported version for tests/integration/test_ray_versions.py. Exit 5 (no tests) is a failure, except
# in the second pass when extra args may have filtered out every integration test.
run_pass() {
  local python=$1 other=$2 allow_empty=$3
  shift 3
  local rc=0
  VC_OTHER_RAY_PYTHON=$other "$python" -m pytest -ra -p no:cacheprovider --timeout=900 --durations=10 "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    [ "$allow_empty" = 1 ] && return 0
    echo "pytest collected no tests: that is a failure here" >&2
    return 1
  fi
  return "$rc"
}

# VC_PARALLEL=1 runs the two passes side by side (each lab takes its own namespace numbers under a lock, so they
# do not meet): ~16 min instead of ~20 here, but on 2 cores the contention makes Ray's start-up time out now and
# then, so CI runs them one after the other.
old_pass() {
  # only what depends on Ray's version: starting and stopping Ray, its ports and auth, the Jobs/State API and the
  # GCS that submit and watch read (torchrun, SSH, Slurm, the dashboard tunnel and the planner's measurements do not)
  run_pass .venv-ray-old/bin/python "$PWD/.venv/bin/python" "$([ "$#" -gt 0 ] && echo 1 || echo 0)" \
    tests/integration/test_ray_versions.py tests/integration/test_lifecycle.py tests/integration/test_check.py \
    tests/integration/test_security_listeners.py tests/integration/test_submit_ray.py \
    tests/integration/test_watch.py::test_user_error_is_not_retried \
    tests/integration/test_watch.py::test_hang_is_stopped_and_resumed \
    tests/integration/test_watch.py::test_worker_killed_and_back \
    "tests/integration/test_watch.py::test_every_submit_form_resumes[command]" "$@"
}
rc=0; old_rc=0; old_pid=""
old_log=$(mktemp -t vc-old-ray-XXXX.log)
if [ "${VC_OLDEST_RAY:-1}" != 0 ] && [ "${VC_PARALLEL:-0}" = 1 ]; then
  old_pass "$@" >"$old_log" 2>&1 & old_pid=$!
fi
run_pass .venv/bin/python "$PWD/.venv-ray-old/bin/python" 0 "$@" || rc=$?
if [ "${VC_OLDEST_RAY:-1}" != 0 ]; then
  echo "== the Ray-version-dependent integration tests again, on the oldest supported Ray ($(.venv-ray-old/bin/python -c 'import ray; print(ray.__version__)'))"
  if [ -n "$old_pid" ]; then
    wait "$old_pid" || old_rc=$?
    cat "$old_log"
  else
    old_pass "$@" || old_rc=$?
  fi
  [ "$rc" -ne 0 ] || rc=$old_rc
fi
rm -f "$old_log"
exit "$rc"
