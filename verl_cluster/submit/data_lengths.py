"""What is known of a job's sequence lengths, gathered for `plan` and `submit`: the training prompts measured
(on the cluster's head node; on this machine for `plan --data`, or for `plan` without a cluster when the job's
training files are here), the lengths an earlier run of the job logged
(length_store), and the job's placement.fill / mean_response_tokens. placement/lengths.py decides from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from verl_cluster.config.job import JobSpec
from verl_cluster.errors import ConfigError
from verl_cluster.placement.lengths import Lengths, PromptStats, resolve_lengths

PROBE = Path(__file__).with_name("prompt_probe.py")
REMOTE_SCHEMES = ("hdfs://", "s3://", "gs://", "http://", "https://")


def probe_request(job: JobSpec, files: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """What prompt_probe needs: the files, the model whose tokenizer verl uses, the prompt column, the limit."""
    from verl_cluster.submit.preflight import _as_list, model_path

    ov = job.verl_overrides()
    chosen = list(files) if files is not None else _as_list(ov.get("data.train_files"))
    kwargs = ov.get("data.apply_chat_template_kwargs")
    return {"files": [f for f in chosen if not f.startswith(REMOTE_SCHEMES)],
            "model": model_path(job, ov), "prompt_key": str(ov.get("data.prompt_key") or "prompt"),
            "limit": int(ov.get("data.max_prompt_length") or 512),
            "template_kwargs": kwargs if isinstance(kwargs, dict) else {}}


def _stats(doc: Any, where: str) -> tuple[Optional[PromptStats], str]:
    if not isinstance(doc, dict):
        return None, f"prompt lengths not measured {where}: no answer"
    if doc.get("error"):
        return None, f"prompt lengths not measured {where}: {doc['error']}"
    note = "; ".join(f"{f}: {e}" for f, e in (doc.get("errors") or {}).items())
    return PromptStats.from_probe(doc), (f"some files were not read {where}: {note}" if note else "")


def measure_here(job: JobSpec, files: Sequence[str]) -> PromptStats:
    """`plan --data FILE...`: measured on this machine; a file that cannot be read is bad input."""
    from verl_cluster.submit import prompt_probe

    for f in files:
        if not Path(f).expanduser().is_file():
            raise ConfigError(f"--data {f}: no such file", "give the training parquet (verl's format)")
        if Path(f).expanduser().stat().st_size == 0:
            raise ConfigError(f"--data {f}: empty file (0 bytes)", "give the training parquet (verl's format)")
    req = probe_request(job, files)
    doc = prompt_probe.measure(req["files"], req["model"], req["prompt_key"], req["limit"],
                               template_kwargs=req["template_kwargs"])
    if doc.get("error") == "pyarrow is not installed here":
        raise ConfigError("--data: reading parquet needs pyarrow, which is not installed here",
                          "pip install 'verl-cluster[data]' (the data extra: pyarrow), or `plan -c CLUSTER` to "
                          "measure the job's training files on the cluster's head node")
    if doc.get("error") or doc.get("errors"):
        why = doc.get("error") or "; ".join(f"{k}: {v}" for k, v in doc["errors"].items())
        raise ConfigError(f"--data: cannot read the prompts: {why}",
                          f"the file must be parquet with a `{req['prompt_key']}` column of chat messages")
    return PromptStats.from_probe(doc)


def measure_job_files_here(job: JobSpec) -> tuple[Optional[PromptStats], str]:
    """`plan` without a cluster: the job's own training files (data.train_files, `~` and $VAR expanded here),
    measured on this machine as submit measures them on the head node; (None, why) when they cannot be."""
    import os

    from verl_cluster.submit import prompt_probe
    from verl_cluster.submit.node_paths import job_env

    req = probe_request(job)
    if not req["files"]:
        return None, ""
    env = {**os.environ, **job_env(job)}
    here = {f: _expand(f, env) for f in req["files"]}
    absent = [f for f, p in here.items() if not Path(p).is_file()]
    elsewhere = "`plan -c CLUSTER` measures them on its head node, as submit does, or --data FILE.parquet"
    if len(absent) == len(here):
        return None, f"prompt lengths not measured: {', '.join(absent)} not on this machine ({elsewhere})"
    doc = prompt_probe.measure([here[f] for f in req["files"] if f not in absent], req["model"], req["prompt_key"],
                               req["limit"], template_kwargs=req["template_kwargs"])
    if doc.get("error") == "pyarrow is not installed here":
        return None, ("prompt lengths not measured: pyarrow is not installed here (pip install 'verl-cluster[data]'"
                      f"), or {elsewhere}")
    stats, note = _stats(doc, "on this machine")
    if absent and stats is not None:
        note = "; ".join(x for x in (note, f"not on this machine, not measured: {', '.join(absent)}") if x)
    return stats, note


def _expand(path: str, env: dict) -> str:
    """`~` and $VAR as a shell here would expand them, with the job's env over this shell's."""
    import os
    import re

    path = os.path.expanduser(path)
    return re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), path)  # ${...}: OmegaConf's, verl's own


def measure_on_cluster(spec, job: JobSpec, timeout: float = 180.0) -> tuple[Optional[PromptStats], str]:
    """The training prompts measured on the first node (the head), with the node's tokenizer when it has the
    model; (None, why) when they cannot be (no local files, the node's Python lacks pyarrow, ...)."""
    import json

    from verl_cluster.launchers import runner_for
    from verl_cluster.runners.remote_python import run_python

    req = probe_request(job)
    if not req["files"]:
        return None, "prompt lengths not measured: the job names no training file on the nodes' filesystems"
    node = next(n for _, n in spec.nodes())
    runner = runner_for(spec, node)
    try:
        doc = run_python(runner, spec.python_executable(node), PROBE.read_text(), [json.dumps(req)], timeout=timeout)
    except Exception as e:  # noqa: BLE001 - an unreadable node only costs the measurement (preflight names it)
        return None, f"prompt lengths not measured on {node.host}: {getattr(e, 'reason', None) or e}"
    finally:
        runner.close()
    return _stats(doc, f"on {node.host}")


def gather_lengths(job: JobSpec, *, spec=None, data: Optional[Sequence[str]] = None, fill: Optional[float] = None,
                   logged: Any = "store") -> tuple[Lengths, list[str]]:
    """(the lengths to plan at, notes on what could not be known). `data`: files to measure here (plan --data);
    else, with `spec`, the job's training files on the cluster. `logged`: an earlier run's record, or "store" to
    read length_store. A stated fill replaces both means, so nothing is measured then."""
    notes: list[str] = []
    prompts = None
    stated = fill is not None or job.placement.fill is not None
    if data:
        prompts = measure_here(job, data)
    elif not stated:  # the job's training files: on the cluster's head node, else here
        prompts, note = measure_on_cluster(spec, job) if spec is not None else measure_job_files_here(job)
        if note:
            notes.append(note)
    if logged == "store":
        from verl_cluster.records.length_store import lookup

        logged = lookup(job.name)
    lengths = resolve_lengths(job, prompts=prompts, logged=logged, fill=fill)
    if prompts is None and logged and "logged" in (lengths.prompt_source or ""):
        notes = []  # an earlier run's prompts stand in: nothing is missing to say
    return lengths, notes
