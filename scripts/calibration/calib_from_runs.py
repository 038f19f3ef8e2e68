#!/usr/bin/env python3
"""Turn a verl run recorded by scripts/gpu/gpu_e2e.sh into a calibration fixture for the planner's host-RAM and
step-time models (tests/fixtures/verl_runs/calibration_runs.json, replayed by tests/unit/test_plan_time_host.py).

    python3 scripts/calibration/calib_from_runs.py LOGS NAME [NAME ...] [--role fit|hold-out] [--host-role R] [--time-role R]
                                       [--flash-attn auto|yes|no] [--log-name FILE.log] [--write] [--json]

LOGS is gpu_e2e.sh's $LOGS (unpacked e2e.tgz): for run NAME it reads plan-NAME.json (`plan --json`), the
`NN-submit-NAME.log` step log (first line: the submit command, then the job's log) and, when there,
nvml-NAME.jsonl (scripts/gpu/gpu_mem_sampler.py) and log-NAME.txt (the log, each line stamped with its time).
The entry is the job as it ran: the submitted key=value words that shape the run (model.path becomes
model.catalog by parameter count; data files, env, step counts and folders are dropped) plus the micro batches the
plan applied; its log fixture keeps the lines the replay and docs read (per-step metrics, vLLM's memory lines,
checkpoint saves, the end). With the sampler's file the entry also carries what the node's RAM did (`sampled`).
Roles: `fit-*` runs are fitted on and `hold-*` held out, unless --role/--host-role/--time-role say otherwise.
--write adds (or replaces) the entries in the fixture file and writes the logs next to the others; without it the
entries are printed. A run whose files are missing (skipped by the budget) or that reached no step is named and
left out (exit 1); exit 2 when none could be read. Each run's plan is replayed at the run's own lengths and the
pairs printed (predicted vs measured), as the test will see them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verl_cluster.verl_logs.verl_log import VerlProgress  # noqa: E402

RUNS_FILE = ROOT / "tests/fixtures/verl_runs/calibration_runs.json"
LOGS_DIR = ROOT / "tests/fixtures/verl_logs"
GIB_PER_MIB = 1 / 1024
# submitted words that do not change what the plan models (paths, logging, how long the run lasts)
DROP = re.compile(r"^(model\.path|data\.(train|val)_files|env\.|trainer\.(total_training_steps|test_freq|"
                  r"val_before_train|default_local_dir|total_epochs|experiment_name|project_name|logger)\b)")
KEEP_LINE = re.compile(r"step:\d+ - |Saving checkpoint|local_global_step_folder|Model loading took|"
                       r"Available KV cache memory|GPU KV cache size|Graph capturing finished|sleep freed|"
                       r"SUCCEEDED|FAILED|STOPPED|Error: |error: ")
SKIP_LINE = re.compile(r"Warning|warnings\.warn")  # start-up noise (optional engines missing, deprecations)
TAIL_LINES = 5
STAMP = re.compile(r"^(\d+\.\d+) (.*)$")


class RunFilesError(Exception):
    """A run's files are missing or unreadable; the message names the file."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RunFilesError(f"{path}: missing (is LOGS gpu_e2e.sh's $LOGS, and NAME the run's name?)") from None
    except json.JSONDecodeError as e:
        raise RunFilesError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None


def submit_log(logs: Path, name: str) -> tuple[Path, str, list[str]]:
    """(the step log, the job file, the submitted words) from the first line `$ ... submit JOB k=v ... --json`."""
    found = sorted(logs.glob(f"*-submit-{name}.log"))
    if not found:
        raise RunFilesError(f"{logs}: no *-submit-{name}.log (the run's submit step log)")
    path = found[-1]
    argv = path.read_text(errors="replace").split("\n", 1)[0].split()
    if "submit" not in argv:
        raise RunFilesError(f"{path}:1: expected the submit command line, got {' '.join(argv)[:80]!r}")
    rest = argv[argv.index("submit") + 1:]
    return path, rest[0], [a for a in rest[1:] if "=" in a and not a.startswith("-")]


def catalog_name(params: int) -> Optional[str]:
    """The catalog model with exactly this many parameters (the random-init shapes are the real ones); of models
    alike (Qwen2 and Qwen2.5 at 0.5B), the shape the GPU runs are made from (make_tiny_model.py --shape)."""
    from verl_cluster.testdata.tiny_model import SHAPES
    from verl_cluster.placement.model_shape import catalog, catalog_shape

    alike = [n for n in catalog() if catalog_shape(n).params == params]
    return next((n for n in alike if n in SHAPES), alike[0] if alike else None)


def flash_attn_of(plan: dict, args: list[str], steps_log: Path, choice: str) -> bool:
    """Whether flash-attn was importable on the machine: the plan's attention when the job did not pin one; else
    the run's flash-attn install step (gpu_e2e.sh `fa`)."""
    if choice != "auto":
        return choice == "yes"
    if not any("attn_implementation=" in a for a in args):
        return str(plan.get("settings", {}).get("attn_implementation", "")).startswith("flash")
    text = steps_log.read_text() if steps_log.exists() else ""
    m = re.findall(r"-flash-attn rc=(\d+)", text)
    if not m:
        raise RunFilesError(f"{steps_log}: the job pins its attention and no flash-attn step is recorded: "
                            "say --flash-attn yes|no")
    return m[-1] == "0"


def log_lines(path: Path) -> list[str]:
    """The job's log lines (after the step log's command line)."""
    return path.read_text(errors="replace").splitlines()[1:]


def fixture_lines(lines: list[str]) -> list[str]:
    keep = [ln for ln in lines if KEEP_LINE.search(ln) and not SKIP_LINE.search(ln)]
    tail = [ln for ln in lines[-TAIL_LINES:] if ln not in keep[-TAIL_LINES:]]
    return keep + tail


def progress(lines: list[str]) -> VerlProgress:
    v = VerlProgress()
    v.feed("\n".join(lines) + "\n")
    v.flush()
    return v


def sampled(samples_path: Path, stamped_path: Path, steps: dict) -> Optional[dict]:
    """The node's RAM from the sampler: baseline (first sample, before the job), peak over the run and over its
    training steps, lowest MemAvailable, /dev/shm, each role's peak, and the sample at each of verl's step lines."""
    if not samples_path.exists():
        return None
    host, summary = [], {}
    for line in samples_path.read_text().splitlines():
        d = json.loads(line)
        if "host" in d:
            host.append((d["t"], d["host"]))
        elif "summary" in d:
            summary = d["summary"]
    if not host:
        return None
    gib = lambda mib: round(mib * GIB_PER_MIB, 2)  # noqa: E731
    out: dict[str, Any] = {"psutil_used_is": summary.get("host", {}).get("used_is"),
                           "baseline_used_gib": gib(host[0][1]["used"]),
                           "peak_used_gib": gib(max(h["used"] for _, h in host)),
                           "peak_used_other_definition_gib": gib(max(
                               h["used_legacy" if h["used"] == h["used_available"] else "used_available"]
                               for _, h in host)),
                           "min_available_gib": gib(min(h["available"] for _, h in host)),
                           "peak_dev_shm_gib": gib(max(h["dev_shm"] for _, h in host)),
                           "peak_gpu_gib": [gib(x) for x in summary.get("peak_gpu_mib", [])]}
    roles = summary.get("host", {}).get("roles", {})
    out["roles_peak_gib"] = {r: {k: gib(v[k]) for k in ("rss", "anon", "pss") if v.get(k) is not None}
                             for r, v in sorted(roles.items())}
    times = step_times(stamped_path)
    if times:
        first = min(times)
        start = times[first] - steps.get(first, {}).get("timing_s/step", 0.0)
        window = [h["used"] for t, h in host if start <= t <= max(times.values())]
        if window:
            out["peak_used_in_steps_gib"] = gib(max(window))
        at = []
        for step, t in sorted(times.items()):
            before = [h for ts, h in host if ts <= t]
            logged = next((v for k, v in steps.get(step, {}).items() if k.endswith("perf/cpu_memory_used_gb")), None)
            if before and logged is not None:
                h = before[-1]
                row = {"step": step, "verl_gib": round(logged, 2), "used_available_gib": gib(h["used_available"]),
                       "used_legacy_gib": gib(h["used_legacy"])}
                row.update(roles_at(host, t))
                at.append(row)
        out["at_steps"] = at
    return out


def roles_at(host: list[tuple[float, dict]], t: float, within_s: float = 5.0) -> dict:
    """Each role's PSS and shared memory (pinned buffers) at the last sample up to t (within within_s) that has
    every role's PSS (the sampler reads PSS every few samples only; after the last step line the job's processes
    exit): what splits the node's RAM into its processes."""
    full = [(t - ts, h) for ts, h in host if 0 <= t - ts <= within_s and h.get("roles")
            and all(v.get("pss") is not None for v in h["roles"].values())]
    if not full:
        return {}
    roles = min(full, key=lambda x: x[0])[1]["roles"]
    gib = lambda mib: round(mib * GIB_PER_MIB, 2)  # noqa: E731
    return {"roles_pss_gib": {r: gib(v["pss"]) for r, v in sorted(roles.items())},
            "roles_shmem_gib": {r: gib(v["shmem"]) for r, v in sorted(roles.items()) if v.get("shmem", 0) >= 10}}


def step_times(stamped_path: Path) -> dict[int, float]:
    """When each `step:N - ` line appeared (the sampler's stamped copy of the log)."""
    out: dict[int, float] = {}
    if not stamped_path.exists():
        return out
    for line in stamped_path.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        s = re.search(r"step:(\d+) - ", line)
        if m and s:
            out.setdefault(int(s.group(1)), float(m.group(1)))
    return out


def role_for(name: str, given: Optional[str]) -> str:
    if given:
        return given
    if name.startswith("fit-"):
        return "fit"
    if name.startswith("hold-"):
        return "hold-out"
    raise RunFilesError(f"{name}: not named fit-* or hold-*: say --role fit|hold-out")


def entry_for(logs: Path, name: str, *, host_role: Optional[str] = None, time_role: Optional[str] = None,
              flash: str = "auto", log_name: Optional[str] = None) -> tuple[dict, list[str]]:
    """(the calibration entry, the log fixture's lines) for run NAME under LOGS."""
    plan = read_json(logs / f"plan-{name}.json")
    step_log, job, words = submit_log(logs, name)
    lines = log_lines(step_log)
    prog = progress(lines)
    if not prog.steps:
        raise RunFilesError(f"{step_log}: no `step:N - ` metrics lines: the run did not reach a step")
    params = int(plan.get("model", {}).get("params") or 0)
    shape = catalog_name(params)
    args = [] if shape is None else [f"model.catalog={shape}"]
    args += [w for w in words if not DROP.match(w)]
    own = {w.partition("=")[0].lstrip("+") for w in args}
    for key, value in (plan.get("overrides") or {}).items():
        if "micro_batch_size" in key and key.lstrip("+") not in own:
            args.append(f"{key}={json.dumps(value) if not isinstance(value, str) else value}")
    entry: dict[str, Any] = {"job": job, "flash_attn": flash_attn_of(plan, words, logs / "steps.log", flash)}
    if shape is None:
        entry["tiny_model"] = True
    entry.update({"args": args, "logs": [log_name or f"h100_{name}.log"], "first_steps": [1],
                  "host": role_for(name, host_role), "time": role_for(name, time_role)})
    got = sampled(logs / f"nvml-{name}.jsonl", logs / f"log-{name}.txt", prog.steps)
    if got:
        entry["sampled"] = got
    return entry, fixture_lines(lines)


def write_runs(path: Path, runs_doc: dict) -> None:
    """The fixture file, one key per line within each run (diffs stay readable)."""
    out = ["{", f'  "_comment": {json.dumps(runs_doc.get("_comment", ""), ensure_ascii=False)},', '  "runs": {']
    names = list(runs_doc["runs"])
    for i, name in enumerate(names):
        body = runs_doc["runs"][name]
        keys = list(body)
        out.append(f"    {json.dumps(name)}: {{")
        for j, k in enumerate(keys):
            comma = "," if j < len(keys) - 1 else ""
            out.append(f"      {json.dumps(k)}: {json.dumps(body[k], ensure_ascii=False)}{comma}")
        out.append("    }" + ("," if i < len(names) - 1 else ""))
    out += ["  }", "}"]
    path.write_text("\n".join(out) + "\n")


def replay(entry: dict, logs_dir: Path, tmp: Path) -> tuple[Any, dict]:
    """(the plan re-made for the recorded job on the recorded H100, with or without flash-attn, at the run's own
    lengths; what verl logged, reduced by check_run.measured): tests/unit/test_plan_time_host.py's view of a run."""
    from dataclasses import replace

    from verl_cluster.config.job import load_job
    from verl_cluster.facts.model import NodeFacts, from_json
    from verl_cluster.placement import plan_job
    from verl_cluster.placement.check_run import measured
    from verl_cluster.placement.settings import read_settings

    facts = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h100x1.json").read_text())
    if not entry["flash_attn"]:
        facts = replace(facts, versions={k: v for k, v in facts.versions.items() if k != "flash_attn"})
    args = list(entry["args"])
    if entry.get("tiny_model"):
        from verl_cluster.testdata.tiny_model import write_model

        write_model(tmp / "tiny", "tiny", seed=0)
        args.append(f"model.path={tmp / 'tiny'}")
    steps: dict = {}
    for log in entry["logs"]:
        steps.update(progress((logs_dir / log).read_text(errors="replace").splitlines()).steps)
    got = measured(steps, entry["first_steps"])
    job = load_job(ROOT / entry["job"], args)
    s = read_settings(job)
    fill = got["tokens_per_step"] / s.sequences / s.seq_len  # the lengths the run really had
    return plan_job(job, [facts], fill=fill), got


def replay_pairs(entry: dict, logs_dir: Path, tmp: Path) -> list[dict]:
    from verl_cluster.placement.check_run import pairs

    plan, got = replay(entry, logs_dir, tmp)
    return pairs(plan.predictions(), got)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", type=Path, help="gpu_e2e.sh's $LOGS folder")
    ap.add_argument("names", nargs="+", help="run names (run_verl's NAME)")
    ap.add_argument("--role", choices=("fit", "hold-out"), help="both roles (default: from the name)")
    ap.add_argument("--host-role", choices=("fit", "hold-out"))
    ap.add_argument("--time-role", choices=("fit", "hold-out"))
    ap.add_argument("--flash-attn", choices=("auto", "yes", "no"), default="auto")
    ap.add_argument("--log-name", help="the log fixture's file name (one run only; default h100_NAME.log)")
    ap.add_argument("--entry-name", help="the entry's key (one run only; default NAME)")
    ap.add_argument("--runs-file", type=Path, default=RUNS_FILE)
    ap.add_argument("--logs-dir", type=Path, default=LOGS_DIR)
    ap.add_argument("--write", action="store_true", help="add the entries to --runs-file, the logs to --logs-dir")
    ap.add_argument("--json", action="store_true", help="print the entries (and their pairs) as JSON")
    a = ap.parse_args(argv)
    if len(a.names) > 1 and (a.log_name or a.entry_name):
        ap.error("--log-name/--entry-name name one run")
    import tempfile

    done, failed = {}, []
    try:
        doc = read_json(a.runs_file)
    except RunFilesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name in a.names:  # a run that was skipped or failed is named and left out; the others go on
        try:
            entry, lines = entry_for(a.logs, name, host_role=a.host_role or a.role, time_role=a.time_role or a.role,
                                     flash=a.flash_attn, log_name=a.log_name)
        except RunFilesError as e:
            print(f"error: {e}", file=sys.stderr)
            failed.append(name)
            continue
        key = a.entry_name or name
        target = a.logs_dir if a.write else Path(tempfile.mkdtemp())
        (target / entry["logs"][0]).write_text("\n".join(lines) + "\n")
        with tempfile.TemporaryDirectory() as tmp:
            rows = replay_pairs(entry, target, Path(tmp))
        done[key] = {"entry": entry, "pairs": rows}
        doc["runs"][key] = entry
    if not done:
        return 2
    if a.write:
        write_runs(a.runs_file, doc)
    if a.json:
        print(json.dumps(done, indent=1))
    else:
        for key, d in done.items():
            print(f"{key}: {json.dumps(d['entry'])}")
            for r in d["pairs"]:
                print(f"  {r['what']:<32} predicted {r['predicted']:>8} measured {r['measured']:>8} {r['error']:+.1%}")
        if a.write:
            print(f"wrote {', '.join(done)} into {a.runs_file} and {a.logs_dir}/")
    if failed:
        print(f"left out: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
