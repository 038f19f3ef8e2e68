#!/usr/bin/env python3
"""Inject one fault into a running verl job on this machine, when it reaches a chosen point (GPU e2e runs).

    python3 scripts/gpu/gpu_fault.py --after-file CKPT/global_step_2 [--delay 2] --signal KILL --match ray::WorkerDict
    python3 scripts/gpu/gpu_fault.py --after-log LOG --after-pattern 'step:3 ' --signal STOP --match ray::WorkerDict

Waits (bounded by --timeout) for the file to exist or the pattern to appear in the log, sleeps --delay, sends the
signal to the first process whose command line matches --match (oldest first), and prints one JSON line:
{"fault_at": unix time, "signal": ..., "pid": ..., "cmd": ...} (also to --out). Exit 1 when nothing matched in time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time


def processes(match: str) -> list[tuple[float, int, str]]:
    """(start time, pid, command line) of every process whose command line contains `match`, oldest first."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = b" ".join(a for a in fh.read().split(b"\0") if a).decode(errors="replace")
            start = os.stat(f"/proc/{d}").st_mtime
        except OSError:
            continue
        if cmd.startswith(match):  # a process title (Ray: ray::WorkerDict...), not a word in an argument
            found.append((start, int(d), cmd[:200]))
    return sorted(found)


def wait_for(args) -> bool:
    deadline = time.time() + args.timeout
    pattern = re.compile(args.after_pattern) if args.after_pattern else None
    while time.time() < deadline:
        if args.after_file and os.path.exists(args.after_file):
            return True
        if pattern and args.after_log and os.path.exists(args.after_log):
            with open(args.after_log, errors="replace") as fh:
                if pattern.search(fh.read()):
                    return True
        time.sleep(0.5)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--after-file")
    ap.add_argument("--after-log")
    ap.add_argument("--after-pattern")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--signal", default="KILL", help="KILL, STOP, TERM ...")
    ap.add_argument("--match", default="ray::WorkerDict")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not (args.after_file or (args.after_log and args.after_pattern)):
        ap.error("give --after-file, or --after-log with --after-pattern")
    if not wait_for(args):
        print(json.dumps({"error": "the trigger never came", "timeout_s": args.timeout}))
        return 1
    time.sleep(args.delay)
    procs = processes(args.match)
    if not procs:
        print(json.dumps({"error": f"no process matches {args.match!r}"}))
        return 1
    _, pid, cmd = procs[0]
    sig = getattr(signal, "SIG" + args.signal.upper())
    t = time.time()
    os.kill(pid, sig)
    doc = {"fault_at": t, "signal": args.signal.upper(), "pid": pid, "cmd": cmd, "matched": len(procs)}
    line = json.dumps(doc)
    print(line)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
