"""Read a verl run from its log lines: the metrics its console logger prints each step, the checkpoints it saves,
and the failure it dies of (classified, with the fix), so `submit` can end with a summary instead of a scroll.

verl's console logger prints `step:N - key:value - key:value ...` once per training step (Ray prefixes the
actor's lines with `(TaskRunner pid=...)`); validation metrics are keys starting with `val-`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from verl_cluster.verl_logs.run_eta import RunEta

_STEP = re.compile(r"step:(\d+) - (.*)$")
# verl prints numpy scalars as np.float64(0.0) in validation metrics
_KV = re.compile(r"^([^\s:][^:]*):(?:np\.\w+\()?(-?[0-9.]+(?:e[-+]?\d+)?|nan|inf|-inf|True|False)\)?$")
_SAVED = re.compile(r"local_global_step_folder:\s*(\S+)|Saving checkpoint to:?\s*(\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# a line the Python interpreter itself prints (argv[0] first; Ray prefixes its actors' lines, never the driver's)
_PY = r"^\S*(?:python|pypy)[\w.-]*: "

# (class, pattern, what it means, the fix); the first match in the log wins, so specific before generic.
FAILURES: tuple[tuple[str, re.Pattern, str, str], ...] = tuple((c, re.compile(p), w, f) for c, p, w, f in (
    ("oom", r"No available memory for the cache blocks|insufficient.*KV cache|max_model_len.*larger than the maximum "
     r"number of tokens that can be stored in KV cache",
     "vLLM has no room for the KV cache of one sequence",
     "raise actor_rollout_ref.rollout.gpu_memory_utilization or offload the trainer's states (verl-cluster plan)"),
    ("oom", r"CUDA out of memory\. Tried to allocate",  # the line with the numbers, before the wrappers
     "a GPU ran out of memory",
     "run `verl-cluster plan JOB` and use its micro batches / offload / gpu_memory_utilization"),
    ("oom", r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|CUDA error: out of memory",
     "a GPU ran out of memory",
     "run `verl-cluster plan JOB` and use its micro batches / offload / gpu_memory_utilization"),
    ("oom", r"oom-kill|Killed process|OutOfMemoryError: Task was killed due to the node running low on memory",
     "a node ran out of host memory", "offload less, or use nodes with more RAM (plan shows host memory)"),
    ("nccl-timeout", r"Watchdog caught collective operation timeout|NCCL watchdog timeout|ProcessGroupNCCL.*[Tt]imeout",
     "an NCCL collective timed out", "verl-cluster check CLUSTER (NCCL interface, blocked ports)"),
    ("gpu-fault", r"CUDA error: (?!out of memory)|Xid|uncorrectable ECC|GPU is lost|an illegal memory access|"
     r"fallen off the bus",
     "a GPU or CUDA error", "verl-cluster doctor on the node; a GPU that fell off the bus needs a reboot"),
    ("node-lost", r"its node has died|node .* (?:has been marked dead|died)|NodeDiedError|Owner's node has crashed",
     "a Ray node died", "verl-cluster status CLUSTER; verl-cluster up CLUSTER restarts dead nodes"),
    ("worker-died", r"ActorDiedError|The actor died unexpectedly|Worker exit type|RaySystemError",
     "a Ray worker process died (its node is still up)",
     "look for an OOM kill or a crash of that process (dmesg, the worker's log); watch resumes the run"),
    # the interpreter's own words when the command's -m MODULE or script is not there: no line of it ran
    ("entrypoint", _PY + r"No module named [\w.]+\.__main__; '[\w.]+' is a package and cannot be directly executed",
     "the module to run is a package without a __main__.py",
     "run a module inside it (python -m PACKAGE.MODULE), or add PACKAGE/__main__.py"),
    ("entrypoint", _PY + r"(?:No module named [\w.]+\s*$|Error while finding module specification for |"
     r"can't open file ')",
     "the job's own module or script is not where the job ran",
     "ship the folder that holds it with the job (verl-cluster submit --working-dir DIR -- python -m MODULE ...), "
     "or install it on every node"),
    ("config", r"Failed to merge the Job's runtime env",
     "Ray could not merge the job's runtime_env with the one the program's ray.init() passes",
     "the program's ray.init(runtime_env=...) sets a field the job sets too (verl-cluster ships py_modules and "
     "worker_process_setup_hook for the collector's freeze): submit with --no-gc-freeze, or drop it there"),
    ("missing-package", r"FlashAttention2 has been toggled on, but it cannot be used",
     "flash-attn is not installed where the job ran (verl loads a critic with flash_attention_2 regardless)",
     "install flash-attn on every node, or train without a critic (algorithm.adv_estimator=grpo)"),
    ("missing-package", r"ModuleNotFoundError: No module named '([^']+)'",
     "a Python package is missing where the job ran", "install it in the nodes' environment (same on every node)"),
    ("bad-override", r"Could not override '[^']+'|Key '[^']+' is not in struct|Could not append to config|"
     r"mismatched input .* expected",
     "verl rejected an override", "check the key against verl's config (verl-cluster submit JOB --dry-run)"),
    ("config", r"AssertionError: .*(?:divisible|must be|should be)|ValueError: .*(?:divisible|must be)",
     "verl's config checks refused the settings", "verl-cluster plan JOB shows batch sizes that divide"),
    ("config", r"omegaconf\.errors\.\w+|ConfigAttributeError|ConfigKeyError|MissingMandatoryValue|"
     r"hydra\.errors\.\w+|ConfigCompositionException",
     "verl's Hydra config refused the command", "check the key against verl's config (verl-cluster submit JOB "
     "--dry-run)"),
    ("missing-package", r"ImportError: ", "a Python module could not be imported where the job ran",
     "install the same packages on every node (verl-cluster doctor there)"),
))


def parse_metrics(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """(step, metrics) from one console-logger line, else None."""
    m = _STEP.search(_ANSI.sub("", line))
    if not m:
        return None
    metrics: dict[str, float] = {}
    for item in m.group(2).split(" - "):
        kv = _KV.match(item.strip())
        if kv:
            v = kv.group(2)
            metrics[kv.group(1)] = float(v == "True") if v in ("True", "False") else float(v)
    return (int(m.group(1)), metrics) if metrics else None


@dataclass
class Failure:
    kind: str
    what: str
    fix: str
    line: str

    def to_json(self) -> dict[str, str]:
        return {"class": self.kind, "what": self.what, "fix": self.fix, "evidence": self.line}


def classify(lines: list[str], here: Optional[str] = None) -> Optional[Failure]:
    """The failure the log shows, by the first pattern (in FAILURES order) any line matches; a Python traceback
    that matches none is a user code error; else a command the shell could not run, or Hydra refusing the command
    line before the program ran; None when none is there. `here`: the folder the job was submitted from, where
    an entrypoint not found on the nodes is looked for (then the fix is the command that ships it)."""
    for kind, pat, what, fix in FAILURES:
        for line in lines:
            if pat.search(line):
                if kind == "entrypoint" and here is not None:
                    from verl_cluster.verl_logs.entry_hint import ship_fix

                    fix = ship_fix(line.strip(), lines, here) or fix
                return Failure(kind, what, fix, line.strip()[:300])
    tb = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not tb:
        return _before_the_program(lines)
    errs = [_error_line(lines[a + 1:b]) for a, b in zip(tb, tb[1:] + [len(lines)])]
    # the last traceback that is not interpreter-shutdown noise printed after the real one
    err = next((e for e in reversed(errs) if not _SHUTDOWN_NOISE.search(e)), errs[-1])
    return Failure("user-code", "the job raised an exception", "read the traceback (verl-cluster logs JOB)", err[:300])


# /bin/sh (Ray runs the entrypoint through it) on a command it cannot run: exit 127 (not found) or 126
_SHELL_REFUSED = re.compile(r"^(?:/usr)?(?:/bin/)?(?:sh|bash|dash|zsh): (?:\d+: |line \d+: )?.+: "
                            r"(?:command not found|not found|Permission denied|No such file or directory)\s*$")
_HYDRA_FULL = "HYDRA_FULL_ERROR=1 for a complete stack trace"
_HYDRA_RAN = "Error executing job with overrides"  # Hydra composed the config and ran the program
# lines of a logger (Ray's, Python's logging: verl warns of a missing GPU before Hydra runs), not Hydra's reason
_LOGGER_LINE = re.compile(r"^(?:\d{4}-\d\d-\d\d[ T][\d:,.]+\s+)?\[?(?:INFO|WARNING|WARN|DEBUG|ERROR)\]?[:\s]|"
                          r"^Running entrypoint for job |^\(\S+ pid=\d+\)")


def _before_the_program(lines: list[str]) -> Optional[Failure]:
    """Failures with no traceback that happen before a line of the program runs: the shell cannot run the command,
    or Hydra cannot compose the config from the command line (it prints the reason, then the HYDRA_FULL_ERROR
    line; when the program itself raised, 'Error executing job with overrides' comes first)."""
    said = [x.strip() for x in lines if x.strip() and not _LOGGER_LINE.match(x)]
    shell = said[-1] if said and _SHELL_REFUSED.match(said[-1]) else None  # the job's last word, not a tool's mid-run
    if shell:
        return Failure("bad-command", "the job's command could not be run where the job ran (the shell found no "
                       "such program, or may not run it)", "name a program every node has: `python`/`python3` "
                       "become the cluster's python; others must be on the nodes' PATH, executable", shell[:300])
    at = next((i for i in range(len(lines) - 1, -1, -1) if _HYDRA_FULL in lines[i]), None)
    if at is None or any(_HYDRA_RAN in x for x in lines[:at]):
        return None
    start = max((i + 1 for i in range(at) if lines[i].startswith("Running entrypoint for job ")), default=0)
    said = [x.strip() for x in lines[start:at] if x.strip() and not _LOGGER_LINE.match(x)] or [lines[at].strip()]
    return Failure("hydra-refused", "Hydra refused the command line before the program started",
                   "fix the override it names (the lines before 'HYDRA_FULL_ERROR' in verl-cluster logs JOB); "
                   "verl-cluster submit ... --dry-run shows the full command", said[0][:300])


def traceback_block(lines: list[str], evidence: str, limit: int = 20, tail: Optional[int] = None) -> list[str]:
    """The traceback that ends at the evidence line (its header kept, the middle cut to `limit` lines), so what
    is shown is the job's own error and not the lines printed after it (Ray's and the interpreter's shutdown
    noise); the last `tail` (default `limit`) lines of the log when the evidence is not in a traceback."""
    ends = [i for i, line in enumerate(lines) if evidence and line.strip()[:300] == evidence]
    if ends:
        end = ends[-1]
        starts = [i for i in range(end) if "Traceback (most recent call last)" in lines[i]]
        if starts and end - starts[-1] < 500:
            block = lines[starts[-1]:end + 1]
            return block if len(block) <= limit else [block[0], "  ..."] + block[-(limit - 2):]
    return lines[-(tail or limit):]


# what Python and Ray print while the interpreter exits after the job's own exception
# the last is verl 0.9.1's TaskRunner when the job ends: its data loader's workers are killed (in every run, SUCCEEDED too)
_SHUTDOWN_NOISE = re.compile(r"can't register atexit after shutdown|after interpreter shutdown|"
                             r"sys\.meta_path is None|Python is likely shutting down|"
                             r"DataLoader worker \(pid \d+\) is killed by signal: Killed")


def _error_line(block: list[str]) -> str:
    """The block's error line: the last `...Error: ...` that is not shutdown noise printed after it (an
    `Exception ignored in atexit callback` without a traceback header of its own lands in the same block)."""
    after = [x.strip() for x in block if x.strip()]
    errors = [x for x in after if re.match(r"^(\(\S+ pid=\d+\)\s*)?[\w.]+(Error|Exception)\b", x)]
    return next((x for x in reversed(errors) if not _SHUTDOWN_NOISE.search(x)),
                errors[-1] if errors else (after[-1] if after else ""))


KEEP_STEPS = 32  # steps a reader of a live log keeps whole; older ones are folded into sums (a week holds 10^4+)
_PEAKS = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")
_LENGTH_MAXES = ("response_length/max", "prompt_length/max", "response_length/clip_ratio")
WINDOW_LINE_CHARS = 2000


@dataclass
class Folded:
    """What summary(), vs_plan() and lengths() need of the steps VerlProgress no longer keeps."""
    train: int = 0  # steps with a training metric
    step_time: list = field(default_factory=lambda: [0.0, 0])  # timing_s/step: sum, count
    peaks: dict = field(default_factory=dict)  # key suffix -> the largest value
    val: dict = field(default_factory=dict)  # val-* key -> its latest value
    means: dict = field(default_factory=dict)  # placement.check_run.StepMeans.to_json()
    resp: list = field(default_factory=lambda: [0, None, 0.0])  # response_length/mean: count, max, sum
    prompt: list = field(default_factory=lambda: [0.0, 0])  # prompt_length/mean: sum, count
    maxes: dict = field(default_factory=dict)  # _LENGTH_MAXES key -> the largest value

    def add(self, m: dict[str, float], counted: bool) -> None:
        from verl_cluster.placement.check_run import StepMeans

        if any(not k.startswith("val-") for k in m):
            self.train += 1
            if "timing_s/step" in m:
                self.step_time = [self.step_time[0] + m["timing_s/step"], self.step_time[1] + 1]
        for k, v in m.items():
            if k.startswith("val-"):
                self.val[k] = v
            for suffix in _PEAKS:
                if k.endswith(suffix):
                    self.peaks[suffix] = v if suffix not in self.peaks else max(self.peaks[suffix], v)
        means = StepMeans(self.means)
        means.add(m, counted)
        self.means = means.to_json()
        if "response_length/mean" in m:
            n, top, total = self.resp
            v = m["response_length/mean"]
            self.resp = [n + 1, v if top is None else max(top, v), total + v]
            if "prompt_length/mean" in m:
                self.prompt = [self.prompt[0] + m["prompt_length/mean"], self.prompt[1] + 1]
            for key in _LENGTH_MAXES:
                if key in m:
                    self.maxes[key] = m[key] if key not in self.maxes else max(self.maxes[key], m[key])


@dataclass
class VerlProgress:
    """Fed log lines as they arrive; keeps per-step metrics, checkpoints and a bounded window for classify().
    With `keep_steps`, only the newest steps are kept whole and older ones are folded (`folded`), so a reader
    of a long run holds the same few kilobytes at step 10 and at step 100,000; summary(), vs_plan() and
    lengths() read the same either way."""
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    checkpoints: list[str] = field(default_factory=list)
    window: list[str] = field(default_factory=list)
    window_lines: int = 400
    partial: str = ""  # a line not yet ended by a newline
    predicted: Optional[dict[str, Any]] = None  # the plan's predictions (Plan.predictions()), to hold the run against
    keep_steps: Optional[int] = None  # None: every step kept whole (the scripts that read a finished run's steps)
    first: Optional[int] = None  # the lowest step logged: vs_plan() leaves it and the next out (check_run.warmup)
    folded: Folded = field(default_factory=Folded)
    eta: RunEta = field(default_factory=RunEta)  # the time per step and what is left (verl_logs/run_eta.py)

    def feed(self, text: str) -> None:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        self._lines(lines)

    def flush(self) -> None:
        if self.partial:
            self._lines([self.partial])
            self.partial = ""

    def _lines(self, lines: list[str]) -> None:
        for line in lines:
            got = parse_metrics(line) if "step:" in line else None
            if got:
                step, metrics = got
                self.eta.add(step, metrics)
                self.steps.setdefault(step, {}).update(metrics)
                self.first = step if self.first is None else min(self.first, step)
                if self.keep_steps and len(self.steps) > self.keep_steps:
                    self._fold()
            saved = _SAVED.search(line) if "heckpoint" in line or "global_step_folder" in line else None
            if saved:
                path = saved.group(1) or saved.group(2)
                if path and path not in self.checkpoints:
                    self.checkpoints.append(path)
                    if self.keep_steps:
                        del self.checkpoints[:-16]
            elif not got and ("Training Progress" in line or "training steps" in line or "_freq'" in line
                              or line.startswith("Running entrypoint")):
                self.eta.read_line(line)
            self.window.append(line[:WINDOW_LINE_CHARS])
        del self.window[:-self.window_lines]

    def _fold(self) -> None:
        from verl_cluster.placement.check_run import warmup

        oldest = min(self.steps)
        skip = warmup(self.first if self.first is not None else oldest, self.steps)
        self.folded.add(self.steps.pop(oldest), counted=oldest not in skip)

    def to_json(self) -> dict[str, Any]:
        """What a reader that resumes later needs (the window is rebuilt from the log's tail)."""
        return {"steps": {str(k): v for k, v in self.steps.items()}, "checkpoints": list(self.checkpoints),
                "first": self.first, "folded": asdict(self.folded), "eta": self.eta.to_json()}

    @classmethod
    def from_json(cls, doc: dict[str, Any], predicted: Optional[dict[str, Any]] = None,
                  keep_steps: Optional[int] = KEEP_STEPS) -> "VerlProgress":
        return cls(steps={int(k): dict(v) for k, v in (doc.get("steps") or {}).items()},
                   checkpoints=list(doc.get("checkpoints") or []), predicted=predicted, keep_steps=keep_steps,
                   first=doc.get("first"), folded=Folded(**(doc.get("folded") or {})),
                   eta=RunEta.from_json(doc.get("eta")))

    @property
    def any_step(self) -> bool:
        return bool(self.steps) or self.folded.train > 0 or bool(self.folded.val)

    def summary(self) -> dict[str, Any]:
        self.flush()
        fo = self.folded
        if not self.steps:
            return {"steps": 0, "checkpoints": list(self.checkpoints)}
        train = {s: m for s, m in self.steps.items() if any(not k.startswith("val-") for k in m)}
        last = max(train) if train else max(self.steps)
        lm = self.steps[last]
        val = dict(fo.val)
        val.update({k: v for m in self.steps.values() for k, v in m.items() if k.startswith("val-")})

        def peak(key: str) -> Optional[float]:
            vals = ([fo.peaks[key]] if key in fo.peaks else []) + [
                v for m in self.steps.values() for k, v in m.items() if k.endswith(key)]
            return round(max(vals), 3) if vals else None

        total, n = fo.step_time
        for m in train.values():
            if "timing_s/step" in m:
                total, n = total + m["timing_s/step"], n + 1
        return {
            "steps": fo.train + len(train), "last_step": last,
            "step_time_s": round(lm["timing_s/step"], 2) if "timing_s/step" in lm else None,
            "mean_step_time_s": round(total / n, 2) if n else None,
            "throughput_tokens_per_gpu_s": round(lm["perf/throughput"], 1) if "perf/throughput" in lm else None,
            "max_memory_allocated_gb": peak("perf/max_memory_allocated_gb"),
            "max_memory_reserved_gb": peak("perf/max_memory_reserved_gb"),
            "validation": val, "checkpoints": list(self.checkpoints),
            **self.vs_plan_fields(),
            **({"eta": eta} if (eta := self.estimate()) else {}),
        }

    def vs_plan_fields(self) -> dict[str, Any]:
        """{"vs_plan": rows, "vs_plan_host": its host fit when there is one}; {} without a plan."""
        if not self.predicted:
            return {}
        rows, host = self.vs_plan_both()
        return {"vs_plan": rows, **({"vs_plan_host": host} if host else {})}

    def learn_command(self, command: str) -> None:
        """The job's command line (Ray's entrypoint): the run's length and save/validation frequency it sets."""
        self.eta.learn_command(command)

    def estimate(self) -> Optional[dict[str, Any]]:
        """Time per step, time left and the plan's step time (verl_logs/run_eta.py), from the second step of a start."""
        return self.eta.estimate(self.predicted)

    def _measured(self) -> dict[str, Any]:
        """The run's means over the steps after the warm-up (check_run.warmup)."""
        from verl_cluster.placement.check_run import StepMeans, measured, warmup

        first = self.first if self.first is not None else 0
        return measured(self.steps, skip=warmup(first, self.steps), before=StepMeans(self.folded.means))

    def vs_plan(self) -> list[dict[str, Any]]:
        """Predicted vs measured (the steps after the warm-up, check_run.warmup), once a step after the first is in."""
        return self.vs_plan_both()[0]

    def vs_plan_both(self) -> tuple[list[dict[str, Any]], Optional[dict[str, Any]]]:
        """vs_plan()'s rows, and the factor on the plan's host terms closest to the run with whether it explains its
        miss (check_run.host_fit; None without a plan or steps), from one pass over the steps."""
        from verl_cluster.placement.check_run import host_fit, pairs

        got = self._measured()
        if not got:
            return [], None
        return pairs(self.predicted or {}, got), host_fit(self.predicted, got) if self.predicted else None

    def failure(self) -> Optional[Failure]:
        return classify(self.window)

    def lengths(self) -> dict[str, Any]:
        """The sequence lengths verl logged (its per-step prompt_length/* and response_length/* over the batch):
        the prompts' mean over the steps, and the largest per-step response mean (responses grow as RL trains),
        which is what a plan for the next run of the job should hold."""
        fo = self.folded
        train = [m for m in self.steps.values() if "response_length/mean" in m]
        n, top, total = fo.resp
        if not train and not n:
            return {"steps": 0}
        for m in train:
            v = m["response_length/mean"]
            n, top, total = n + 1, v if top is None else max(top, v), total + v
        p_total, p_n = fo.prompt
        for m in train:
            if "prompt_length/mean" in m:
                p_total, p_n = p_total + m["prompt_length/mean"], p_n + 1
        out: dict[str, Any] = {"steps": n, "response_length_mean": round(top, 1),
                               "response_length_mean_avg": round(total / n, 1)}
        if p_n:
            out["prompt_length_mean"] = round(p_total / p_n, 1)
        for key in _LENGTH_MAXES:
            vals = ([fo.maxes[key]] if key in fo.maxes else []) + [m[key] for m in train if key in m]
            if vals:
                out[key.replace("/", "_")] = round(max(vals), 4)
        return out


def describe(summary: dict[str, Any]) -> list[str]:
    """A few human lines for the end of `submit`."""
    if not summary.get("steps"):
        return ["verl: no training step was logged"] if summary else []
    out = [f"verl: {summary['steps']} step(s), last {summary['last_step']}"
           + (f", step time {summary['step_time_s']} s" if summary.get("step_time_s") is not None else "")
           + (f", {summary['throughput_tokens_per_gpu_s']} tokens/s/GPU"
              if summary.get("throughput_tokens_per_gpu_s") is not None else "")]
    if summary.get("max_memory_reserved_gb") is not None:
        out.append(f"verl: peak GPU memory (torch, trainer) allocated {summary['max_memory_allocated_gb']} GB, "
                   f"reserved {summary['max_memory_reserved_gb']} GB")
    val = summary.get("validation") or {}
    core = {k: v for k, v in val.items() if k.startswith("val-core/")} or val  # verl's headline metrics
    if core:
        out.append("verl: validation " + ", ".join(f"{k}={v:g}" for k, v in sorted(core.items())))
    for ck in summary.get("checkpoints", []):
        out.append(f"verl: checkpoint {ck}")
    return out + vs_plan_lines(summary.get("vs_plan") or [], summary.get("vs_plan_host"))


def vs_plan_lines(rows: list[dict[str, Any]], host: Optional[dict[str, Any]] = None) -> list[str]:
    """One line of predicted vs measured, and a warning for each figure off by more than 25% (a phase under half a
    second on both sides excepted); with the run's host factor (check_run.host_fit), when the step is one of them,
    whether the host's speed explains it."""
    from verl_cluster.placement.check_run import WARN_OFF_BY, worth_warning

    if not rows:
        return []
    fill = next((r["at_fill"] for r in rows if r.get("at_fill")), None)
    at = f" (time at the run's lengths, fill {fill:.2g})" if fill else ""
    out = [f"verl vs plan{at}: " + ", ".join(f"{r['what']} {r['predicted']:g} predicted / {r['measured']:g} measured "
                                        f"({r['error']:+.0%})" for r in rows)]
    warned = worth_warning(rows)
    out += [f"warning: {r['what']} is {r['error']:+.0%} off the plan (more than {WARN_OFF_BY:.0%}): "
            "the plan's model does not hold for this run" for r in warned]
    if host and any(r["what"] == "time step (s)" for r in warned):
        out.append(host_line(host))
    return out


def host_line(host: dict[str, Any]) -> str:
    """What the host factor says of a step off the plan."""
    from verl_cluster.placement.check_run import HOST_PHASE_WITHIN, PHASE_MIN_S

    h, at = host["factor"], host["step_error_at_factor"]
    if not host.get("explains"):
        return (f"not the host alone: with verl's host-side work (the CPU's part of each phase) at {h:g}x the "
                f"calibrated hosts' the step is still {at:+.0%} off the plan")
    base = host.get("planned_at") or 1.0  # a plan made at a host factor (learned here, or stated) was made for it
    than = (f"than the {base:g} the plan was made at (placement.host_factor)" if base != 1.0 else
            "than the plan's calibration")
    how = (f"a faster host {than}" if h < base else
           f"a slower or busier host {than}: `verl-cluster doctor` says its CPU steal")
    # one card kind ran one verl line 1.45-1.73x apart on three hosts (docs/placement.md): the factor is the
    # machine's, so it carries over to the next job on it, where a phase's own factor does not
    return (f"the host explains it: with verl's host-side work (the CPU's part of each phase: launches, Python "
            f"between kernels, the rollout's scheduling) at {h:g}x the calibrated hosts' time the plan's step is "
            f"{at:+.0%} and every phase over {PHASE_MIN_S:g} s within {HOST_PHASE_WITHIN:.0%}: {how}; the next "
            f"plan on these machines starts from it (placement.host_factor: auto)")
