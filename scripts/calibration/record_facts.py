#!/usr/bin/env python3
"""Record this machine's NodeFacts as JSON (for tests/fixtures/facts/). Needs only the stdlib (+ the NVIDIA
driver for GPU facts): it runs verl_cluster/diagnostics/probe_node.py directly, without the package's deps.

    python scripts/calibration/record_facts.py [--head-ip IP] [--note TEXT] > tests/fixtures/facts/NAME.json
"""

import argparse
import datetime
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "..", "verl_cluster", "diagnostics", "probe_node.py")
NVML = os.path.join(HERE, "..", "..", "verl_cluster", "facts", "nvml_node.py")  # shipped in front of the probe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-ip", default=None, help="record which interface routes there")
    ap.add_argument("--note", default="", help="free text kept in the recording")
    ap.add_argument("--fast", action="store_true", help="read verl's version instead of importing it")
    args = ap.parse_args()
    probe = types.ModuleType("probe_node")
    source = "".join(open(path).read() + "\n" for path in (NVML, PROBE))  # as the nodes get it
    exec(compile(source, PROBE, "exec"), probe.__dict__)
    facts = probe.collect(args.head_ip, deep=not args.fast)
    facts["recorded"] = f"{datetime.date.today().isoformat()} by scripts/calibration/record_facts.py on {facts['hostname']}" \
                        + (f": {args.note}" if args.note else "")
    json.dump(facts, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
