#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine and run the whole test suite (what CI runs).
# Needs root for apt and for the network-namespace hosts of the integration tests.
#   bash scripts/test.sh            # everything: the integration tests on the newest supported Ray, then the
#                                   # Ray-version dependent ones on the oldest (.venv-ray-old; VC_OLDEST_RAY=0
#                                   # skips it, VC_PARALLEL=1 runs it beside the first), then the unit tests
#   bash scripts/test.sh -k config  # extra args go to pytest (both Rays)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export VC_REQUIRE_INTEGRATION=${VC_REQUIRE_INTEGRATION:-1}  # missing prerequisites fail, never skip silently
# hundreds of CLI and node-script processes: let Python keep its compiled modules instead of compiling each time
unset PYTHONDONTWRITEBYTECODE

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

# The oldest-Ray pass: only what depends on Ray's version — starting, healing and stopping Ray on nodes, its ports
# and auth, the Jobs/State API, the GCS and the agent's log endpoint that submit and watch read (the submit and watch
# tests below read logs through it); torchrun, SSH, Slurm, host keys, the dashboard tunnel, `check`, log
# classification, the submit forms and the planner's measurements do not. `up` starting, healing (a worker host
# killed and restarted under watch) and `down` on the oldest Ray run inside these; the three-host lifecycle test
# (90 s there) walks the same Ray calls again and runs on the newest only, to keep the suite in its 15 minutes.
OLD_TESTS=(tests/integration/test_ray_versions.py
  tests/integration/test_security_listeners.py tests/integration/test_submit_ray.py
  tests/integration/test_watch.py::test_hang_is_stopped_and_resumed
  tests/integration/test_watch.py::test_worker_killed_and_back)
# integration modules side by side, one module (or the shared cluster's tests) per worker: tests/integration/conftest.py
INTEG_WORKERS=${VC_INTEG_WORKERS:-2}  # more overloads 2 cores: Ray health checks and client connects time out
old_pass() {
  run_pass .venv-ray-old/bin/python "$PWD/.venv/bin/python" "$([ "$#" -gt 0 ] && echo 1 || echo 0)" \
    -n 2 --dist loadgroup "${OLD_TESTS[@]}" "$@"
}
new=.venv/bin/python; old="$PWD/.venv-ray-old/bin/python"
rc=0; old_rc=0
if [ "$#" -gt 0 ]; then  # a chosen subset: everything it selects, then its Ray-dependent part on the oldest Ray
  run_pass $new "$old" 0 "$@" || rc=$?
  if [ "${VC_OLDEST_RAY:-1}" != 0 ]; then old_pass "$@" || old_rc=$?; fi
  [ "$rc" -ne 0 ] || rc=$old_rc
  exit "$rc"
fi
# The whole suite in three stages, two pytest workers each (a serial run of the integration tests keeps a 2-core
# machine a third busy; five workers overloaded it): the integration tests on the newest Ray, modules side by
# side; the Ray-version-dependent ones on the oldest (VC_PARALLEL=1: beside the first, each lab on its own
# subnet); the unit tests on every core.
old_log=$(mktemp -t vc-old-ray-XXXX.log); old_pid=""
if [ "${VC_OLDEST_RAY:-1}" != 0 ] && [ "${VC_PARALLEL:-0}" = 1 ]; then
  old_pass >"$old_log" 2>&1 & old_pid=$!
fi
echo "== integration tests on the newest supported Ray ($($new -c 'import ray; print(ray.__version__)'))"
run_pass $new "$old" 0 -n "$INTEG_WORKERS" --dist loadgroup tests/integration || rc=$?
if [ "${VC_OLDEST_RAY:-1}" != 0 ]; then
  echo "== the Ray-version-dependent integration tests on the oldest supported Ray ($($old -c 'import ray; print(ray.__version__)'))"
  if [ -n "$old_pid" ]; then
    wait "$old_pid" || old_rc=$?
    cat "$old_log"
  else
    old_pass || old_rc=$?
  fi
fi
rm -f "$old_log"
echo "== unit tests"
unit_rc=0
run_pass $new "$old" 0 -n "$(nproc)" tests/unit || unit_rc=$?
for r in $old_rc $unit_rc; do [ "$rc" -ne 0 ] || rc=$r; done
exit "$rc"
