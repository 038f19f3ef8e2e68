#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine and run the whole test suite (what CI runs).
# Needs root for apt and for the network-namespace hosts of the integration tests.
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -k config  # extra args go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export VC_REQUIRE_INTEGRATION=${VC_REQUIRE_INTEGRATION:-1}  # missing prerequisites fail, never skip silently
set +e
.venv/bin/python -m pytest -ra -p no:cacheprovider --timeout=900 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
