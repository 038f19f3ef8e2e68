"""Preflight: what would fail an hour in, caught in seconds before any GPU time.

Each check returns Findings; `run_preflight` runs them all (one failure never hides the others).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job_shape import JobShape
from verl_cluster.config.job import JobSpec, takes_hydra_overrides
from verl_cluster.submit.data_check import check_schema, requirement_for
from verl_cluster.submit.findings import Finding
from verl_cluster.jobs.request import key_origin
from verl_cluster.submit.verl_config import check_verl_config
from verl_cluster.launchers import runner_for
from verl_cluster.runners import fan_out
from verl_cluster.runners.remote_python import run_python

PROBE = Path(__file__).with_name("node_files.py")
REMOTE_SCHEMES = ("hdfs://", "s3://", "gs://", "http://", "https://")


@dataclass(frozen=True)
class PreflightReport:
    findings: list[Finding] = field(default_factory=list)
    # path keys to send as every node expands them (node_paths.judge): key -> value with absolute paths
    paths: dict[str, Any] = field(default_factory=dict)

    def with_paths(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """`overrides` with their `~`/`$VAR` paths as the nodes expand them (the same order of keys)."""
        return {k: self.paths.get(k, v) for k, v in overrides.items()}

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> list[dict]:
        return [f.__dict__ for f in self.findings]


def _as_list(v: Any) -> list[str]:
    if v is None or v == "":
        return []
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]


def data_files(overrides: Mapping[str, Any]) -> list[str]:
    return _as_list(overrides.get("data.train_files")) + _as_list(overrides.get("data.val_files"))


def model_path(job: JobSpec, overrides: Mapping[str, Any]) -> Optional[str]:
    for key in ("actor_rollout_ref.model.path", "model.path", "model.partial_pretrain"):
        if overrides.get(key):
            return str(overrides[key])
    return job.model.path


# ---- data and model: probed on every node, judged here ----
def judge_node_files(job: JobSpec, overrides: Mapping[str, Any], results: Mapping[str, Any],
                     local_schemas: Mapping[str, dict] | None = None) -> list[Finding]:
    """Findings from the node probes: {host: probe JSON or an exception}."""
    out: list[Finding] = []
    req = requirement_for(job.entrypoint, overrides)
    schemas: dict[str, dict] = dict(local_schemas or {})
    missing: dict[str, list[str]] = {}
    for host, res in results.items():
        if isinstance(res, BaseException):
            # the node, not the job's input, is at fault: a "cluster" finding (exit 1, not 2)
            out.append(Finding("error", "cluster", f"{host}: cannot check files there: "
                                                   f"{getattr(res, 'reason', None) or res}"))
            continue
        for d in res.get("data", []):
            if not d["exists"]:
                as_ = d.get("resolved")
                missing.setdefault(d["path"], []).append(host + (f" (as {as_})" if as_ and as_ != d["path"] else ""))
            elif d.get("error"):
                out.append(Finding("error", "data", f"{d['path']} on {host}: {d['error']}"))
            elif not d.get("parquet"):
                out.append(Finding("error", "data", f"{d['path']} on {host}: not a parquet file",
                                   "verl reads parquet; convert it (scripts/prepare_gsm8k.py for GSM8K)"))
            elif d.get("schema"):
                schemas.setdefault(d["path"], d["schema"])
            elif d.get("schema_error") and "not installed" not in d["schema_error"]:
                out.append(Finding("error", "data", f"{d['path']} on {host}: unreadable parquet: {d['schema_error']}"))
        m = res.get("model")
        if m:
            out += _judge_model(host, m)
    for path, hosts in missing.items():
        out.append(Finding("error", "data", f"{path}: not found on {', '.join(hosts)}",
                           "copy the file to the same path on every node (or use a shared filesystem)"))
    if req:
        for path, schema in schemas.items():
            for problem in check_schema(path, schema, req):
                out.append(Finding("error", "data", problem,
                                   "GSM8K: python scripts/prepare_gsm8k.py writes verl's format"))
    checked = [p for p in schemas if p not in missing]
    unreached = any(isinstance(r, BaseException) for r in results.values())
    if checked and not unreached and not any(f.level == "error" and f.check == "data" for f in out):
        what = "columns match verl's schema" if req else "present"
        out.append(Finding("ok", "data", f"{len(checked)} data file(s) on every node; {what}"))
    return out


def _judge_model(host: str, m: Mapping[str, Any]) -> list[Finding]:
    path = m["path"]
    if m["kind"] == "dir":
        lacks = ([] if m["config"] else ["config.json"]) + ([] if m["tokenizer"] else ["tokenizer files"])
        if lacks:
            return [Finding("error", "model", f"model dir {path} on {host} has no {' or '.join(lacks)}",
                            "point model.path at a Hugging Face model folder (config.json, tokenizer.json, weights)")]
        return []
    if m["kind"] == "hub":
        if m["cached"]:
            return []
        if m["offline"]:
            return [Finding("error", "model", f"model `{path}` is not in the Hugging Face cache on {host} and "
                                              "HF_HUB_OFFLINE=1 there", "download it on that node first")]
        return [Finding("warning", "model", f"model `{path}` is not cached on {host}: it will be downloaded at start")]
    if m["kind"] == "file":
        return [Finding("error", "model", f"model path {path} on {host} is a file, not a model folder")]
    return [Finding("error", "model", f"model path {path} not found on {host}",
                    "copy the model to the same path on every node, or use a hub name such as Qwen/Qwen2.5-0.5B-Instruct")]


def probe_node_files(spec: ClusterSpec, files: Sequence[str], model: Optional[str], *, expand: Sequence[str] = (),
                     job: Optional[JobSpec] = None, wandb: bool = False) -> dict[str, Any]:
    """{host: node_files' answer or the exception}: the data files and model, the paths in `expand` expanded in
    the environment the job gets on that node, whether wandb can log in there."""
    from verl_cluster.submit.node_paths import node_env

    source = PROBE.read_text()

    def one(node):
        env = node_env(spec, node, job) if job is not None else {}
        arg = json.dumps({"data": list(files), "model": model, "expand": list(expand), "env": env, "wandb": wandb})
        runner = runner_for(spec, node)
        try:
            return run_python(runner, spec.python_executable(node), source, [arg], timeout=60)
        finally:
            runner.close()

    nodes = [n for _, n in spec.nodes()]
    return {r.host: (r.value if r.ok else r.error) for r in fan_out(nodes, one, key=lambda n: n.host)}


def local_schema(path: str) -> Optional[dict]:
    """Schema of a file that is also on this machine (when the nodes lack pyarrow)."""
    p = Path(path).expanduser()
    if not p.is_file():
        return None
    try:
        import pyarrow.parquet as pq

        from verl_cluster.submit.data_check import schema_tree

        return schema_tree(pq.read_schema(p))
    except Exception:  # noqa: BLE001 - not readable here: the node result stands
        return None


def check_files(spec: ClusterSpec, job: JobSpec, overrides: Mapping[str, Any]) -> list[Finding]:
    return check_nodes(spec, job, overrides)[0]


def check_nodes(spec: ClusterSpec, job: JobSpec, overrides: Mapping[str, Any]) -> tuple[list[Finding], dict]:
    """(findings, path keys to rewrite) of one probe of every node: data files, model, the paths verl opens
    expanded there (node_paths), wandb's login when the job logs to wandb."""
    from verl_cluster.submit.hygiene import wandb_findings, wandb_unknown
    from verl_cluster.submit.node_paths import judge, to_expand

    files = [f for f in data_files(overrides) if not f.startswith(REMOTE_SCHEMES)]
    remote = [f for f in data_files(overrides) if f.startswith(REMOTE_SCHEMES)]
    model = model_path(job, overrides)
    expand = list(dict.fromkeys(v for vs in to_expand(overrides).values() for v in vs))
    wandb = wandb_unknown(spec, job, overrides)
    out = [Finding("skipped", "data", f"{f}: remote storage is not checked") for f in remote]
    if not files and not model and not expand and not wandb:
        return out + [Finding("skipped", "data", "the job names no data files or model")], {}
    results = probe_node_files(spec, files, model, expand=expand, job=job, wandb=wandb)
    rewrites, found = judge(overrides, results)
    out += found
    if wandb:
        out += wandb_findings(results)
    if not files and not model:
        return out, rewrites
    local, unread = {}, []
    for f in files:
        if not any(isinstance(r, dict) and any(d.get("schema") for d in r.get("data", []) if d["path"] == f)
                   for r in results.values()):
            s = local_schema(f)
            if s:
                local[f] = s
            elif _no_pyarrow(results, f):
                unread.append(f)
    found = judge_node_files(job, overrides, results, local)
    if unread and requirement_for(job.entrypoint, overrides) and not any(x.check == "data" and x.level == "error"
                                                                           for x in found):
        found.append(Finding("skipped", "data", f"columns of {', '.join(unread)} not checked: pyarrow is not "
                                                "installed in the nodes' Python nor here",
                             "pip install pyarrow in the nodes' environment (verl needs it to read the data), or "
                             "pip install 'verl-cluster[data]' here"))
    nodes = f"on {_nodes(spec)}"
    out += [_at(x, f"{nodes}; columns read here" if x.check == "data" and x.level == "ok" and local else nodes)
            for x in found]
    unreached = any(isinstance(r, BaseException) for r in results.values())
    if model and not unreached and not any(f.check == "model" and f.level in ("error", "warning") for f in out):
        out.append(Finding("ok", "model", f"model {model} found on every node", where=f"on {_nodes(spec)}"))
    return out, rewrites


def _no_pyarrow(results: Mapping[str, Any], path: str) -> bool:
    """Did every node that has the file lack pyarrow to read its columns?"""
    seen = [d for r in results.values() if isinstance(r, dict) for d in r.get("data", []) if d["path"] == path]
    return bool(seen) and all("not installed" in str(d.get("schema_error") or "") for d in seen if d.get("exists")) \
        and any(d.get("exists") for d in seen)


def _nodes(spec: ClusterSpec) -> str:
    hosts = [n.host for _, n in spec.nodes()]
    return hosts[0] if len(hosts) == 1 else f"every node ({len(hosts)})"


def _at(f: Finding, where: str) -> Finding:
    from dataclasses import replace

    return f if f.where else replace(f, where=where)


def expand_paths(spec: ClusterSpec, job: JobSpec, overrides: Mapping[str, Any]) -> tuple[dict, list[Finding]]:
    """Without the checks (--skip-preflight, a watched run's next attempt): still the paths verl opens as every
    node expands them, where they agree; the others are sent as written, each with a warning."""
    from verl_cluster.submit.node_paths import judge, to_expand, unexpanded

    wanted = to_expand(overrides)
    if not wanted:
        return {}, []
    try:
        results = probe_node_files(spec, [], None, expand=list(dict.fromkeys(v for vs in wanted.values() for v in vs)),
                                   job=job)
    except Exception:  # noqa: BLE001 - no node answered: the paths go as written, with the warning
        results = {}
    rewrites, found = judge(overrides, results) if results else ({}, [])
    warned = [Finding("warning" if f.level == "error" else f.level, f.check, f.message, f.hint) for f in found]
    return rewrites, warned or unexpanded(overrides)  # none: no node could be asked


# ---- verl's own config ----
def verl_check_where(job: JobSpec, overrides: Mapping[str, Any], spec: Optional[ClusterSpec] = None):
    """(result, where it ran): here when this machine has verl (or VC_VERL_PYTHON names a Python that does),
    else in the cluster's head Python, where the job's verl runs (a default install has no verl here)."""
    from verl_cluster.submit.verl_config import check_verl_config_on, verl_available, verl_python

    if spec is None or verl_available(verl_python()):
        return check_verl_config(job.entrypoint, overrides, args=job.args), "here"
    head = spec.head
    runner = runner_for(spec, head)
    where = f"on {head.host}"
    try:
        return check_verl_config_on(runner, spec.python_executable(head), job.entrypoint, overrides,
                                    args=job.args), where
    except Exception as e:  # noqa: BLE001 - an unreachable head costs this check only (the node probe says why)
        from verl_cluster.submit.verl_config import VerlConfigCheck

        why = getattr(e, "reason", None) or f"{type(e).__name__}: {e}"
        return VerlConfigCheck(False, skipped=f"verl is not installed here and the check could not run on "
                                              f"{head.host}: {why}"), where
    finally:
        runner.close()


def check_verl(job: JobSpec, overrides: Mapping[str, Any], spec: Optional[ClusterSpec] = None) -> list[Finding]:
    if not takes_hydra_overrides(job.entrypoint):  # verl's argparse tools (model_merger) have no config to compose
        return []
    res, where = verl_check_where(job, overrides, spec)
    out: list[Finding] = []
    for key, near in res.unknown:
        out.append(Finding("error", "verl-config", f"unknown verl key `{key}`",
                           f"did you mean `{near}`?" if near else f"prefix it with + to add a new key: +{key}=...",
                           where))
    if res.error:
        out.append(Finding("error", "verl-config", f"verl rejects the config: {res.error}", where=where))
    if res.skipped:
        hint = None
        if "not installed" in res.skipped:
            hint = ("install verl where the job runs (the head's Python: ray.ray_executable's environment), or "
                    "here with VC_VERL_PYTHON naming a Python that has it")
        out.append(Finding("skipped", "verl-config", res.skipped, hint, where))
    if res.ran and not res.unknown and not res.error:
        out.append(Finding("ok", "verl-config", "verl's Hydra config composes with all overrides"
                           + ("; verl's validate_config passed" if res.validated else "")
                           + (f" (as at {res.cached}: same verl, config files and overrides)" if res.cached else ""),
                           where=where))
    return out


# ---- resources: the GPUs verl's STRICT_PACK placement groups will ask for ----
@dataclass(frozen=True)
class NodeGpus:
    host: str
    alive: bool
    total: float
    free: Optional[float]  # None when the cluster did not report free resources


def gpu_fit(nodes: Sequence[NodeGpus], per_node: int, nnodes: int) -> list[Finding]:
    """verl asks for one STRICT_PACK group of `per_node` GPUs on each of `nnodes` nodes."""
    alive = [n for n in nodes if n.alive]
    need = f"{nnodes} node(s) x {per_node} GPU(s)"
    if per_node <= 0:
        return []
    big = [n for n in alive if n.total >= per_node]
    if len(big) < nnodes:
        have = ", ".join(f"{n.host}={n.total:g}" for n in alive) or "no alive nodes"
        return [Finding("error", "resources", f"the job needs {need} (trainer.nnodes x trainer.n_gpus_per_node); "
                                              f"the cluster has {have}",
                        "set trainer.n_gpus_per_node / trainer.nnodes to what the nodes have")]
    free = [n for n in big if n.free is None or n.free >= per_node]
    if len(free) < nnodes:
        busy = ", ".join(f"{n.host} {n.free:g}/{n.total:g} free" for n in big if n.free is not None and n.free < per_node)
        return [Finding("error", "resources", f"the job needs {need} free, but GPUs are held: {busy}",
                        "another job holds them (the usual cause of 'Total available GPUs 0'): "
                        "`verl-cluster jobs`, then `verl-cluster stop JOB`")]
    return [Finding("ok", "resources", f"{need} available")]


def gpu_request(overrides: Mapping[str, Any]) -> tuple[int, int]:
    """(n_gpus_per_node, nnodes) verl will ask for (its defaults: 8 and 1)."""
    shape = JobShape.of_overrides(overrides)
    return shape.verl_gpus_per_node, shape.verl_nodes


def nodes_from_status(status: Any) -> list[NodeGpus]:
    out = []
    for n in status.nodes:
        total = float((n.resources or {}).get("GPU", 0.0) or getattr(n, "gpus", 0) or 0)
        free = None if n.available is None else float(n.available.get("GPU", 0.0))
        out.append(NodeGpus(n.host, bool(n.alive), total, free))
    return out


def check_resources(job: JobSpec, overrides: Mapping[str, Any], status: Any) -> list[Finding]:
    if not job.is_ray_only:
        return []
    if status is None:
        return [Finding("skipped", "resources", "cluster status unavailable: GPU fit not checked")]
    per_node, nnodes = gpu_request(overrides)
    return gpu_fit(nodes_from_status(status), per_node, nnodes)


# ---- placement strategy: one the hardware cannot realise fails here, not after submission ----
# Env vars through which a job that plans itself takes its strategy (launch/gpu_smoke_job.py); they win over
# placement.strategy there, as they do in the job.
STRATEGY_ENV = ("GPU_SMOKE_STRATEGY",)


def requested_strategy(job: JobSpec) -> tuple[str, str]:
    """(field, strategy) the job runs with: a self-planning job's strategy env var when set, else
    placement.strategy (file or command line). verl trainers are planned by submit: only placement.strategy."""
    if not job.is_ray_only:
        for name in STRATEGY_ENV:
            value = str(job.env.get(name) or "").strip()
            if value:
                return f"env.{name}", value
    return "placement.strategy", job.placement.strategy or "auto"


def _why_no_pools(want: str, s: Any, g: int, nnodes: int) -> str:
    critic, reward = s.critic, s.reward_model
    have = f"this cluster has {g}" + (" per node" if nnodes > 1 else "")
    if want == "split" and not s.split_placement:
        return ("verl.trainer.main_ppo maps every role to one resource pool (global_pool), so the critic would share "
                "the actor's GPUs anyway; split needs a program that builds two pools (verl's "
                "examples/split_placement/main_ppo_split.py as the job's command)")
    if want == "split":
        if not (critic or reward):
            return "split needs a critic or a reward model for its second pool; this job has neither"
        if g < 2:
            return f"split needs >= 2 GPUs: one pool for actor+rollout(+ref), one for critic/reward; {have}"
        return (f"split needs an even GPU count per node: half for actor+rollout(+ref), half for critic/reward; "
                f"{have}")
    if want == "split-nodes":
        if not s.split_placement:
            return ("verl.trainer.main_ppo maps every role to one resource pool (global_pool); split-nodes needs a "
                    "program that builds its pools (one for actor+rollout(+ref), one for critic/reward) on whole nodes")
        if not (critic or reward):
            return "split-nodes needs a critic or a reward model for its second pool; this job has neither"
        return f"split-nodes needs >= 2 nodes, one pool on each side; this cluster has {nnodes}"
    if not reward:
        return "separate-reward needs a reward model (reward_model.enable: true); this job has none"
    return f"separate-reward needs >= 2 GPUs: one pool for the reward model, one for the other roles; {have}"


def check_strategy(job: JobSpec, facts: Sequence[Any]) -> list[Finding]:
    """Can these nodes (NodeFacts) realise the strategy the job asks for? An error names the field, the job file,
    why not and the fix (check `placement`: the cluster cannot run it, exit 1). Nothing for `auto`."""
    from verl_cluster.errors import VerlClusterError
    from verl_cluster.placement import plan_job
    from verl_cluster.placement.hardware import hardware_from_facts
    from verl_cluster.placement.plan import StrategyUnavailable
    from verl_cluster.placement.planner import STRATEGIES
    from verl_cluster.placement.settings import read_settings

    field_, want = requested_strategy(job)
    if want == "auto":
        return []
    head = f"{job.source}: {field_} is `{want}`"
    if want not in STRATEGIES:
        return [Finding("error", "placement", f"{head}, not a strategy; use one of {', '.join(STRATEGIES)}, auto")]
    try:
        asked = plan_job(job, list(facts), strategy=want)
        why = "" if asked.feasible else f"{want} does not fit: " + ("; ".join(asked.problems[:1]) or "infeasible")
    except StrategyUnavailable:
        s = read_settings(job)
        hw = hardware_from_facts(list(facts), nnodes=s.nnodes, n_gpus_per_node=s.n_gpus_per_node)
        why = _why_no_pools(want, s, hw.gpus_per_node, hw.nnodes)
    if not why:
        return [Finding("ok", "placement", f"{field_} {want}: fits on {asked.hardware}")]
    try:
        auto = plan_job(job, list(facts), strategy="auto")
    except VerlClusterError:
        auto = None
    if auto is None or not auto.feasible:
        fix = f"no strategy fits here: `verl-cluster plan {job.source}` shows why"
    else:
        fix = "use strategy: auto" if field_ == "placement.strategy" else f"unset {field_} or set it to auto"
        fix += f" (the plan picks {auto.strategy} here)"
    return [Finding("error", "placement", f"{head}, but {why}. Fix: {fix}")]


def check_placement_strategy(spec: ClusterSpec, job: JobSpec) -> list[Finding]:
    """check_strategy on the nodes' gathered facts, for jobs that plan themselves (a `command` with a model,
    e.g. launch/gpu_smoke.yaml). verl trainers are planned by submit itself (integrations.placement_plan)."""
    if job.is_ray_only or not (job.model.catalog or job.model.path) or requested_strategy(job)[1] == "auto":
        return []
    from verl_cluster.errors import VerlClusterError
    from verl_cluster.diagnostics.cluster_facts import gather_node_facts

    try:
        return check_strategy(job, gather_node_facts(spec))
    except VerlClusterError as e:  # an unreachable node, no GPUs, a model the planner does not know
        return [Finding("error", "placement", f"cannot check {requested_strategy(job)[0]}: {e.message}", e.hint)]


FLASH_KEYS = ("actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding",
              "+actor_rollout_ref.model.override_config.attn_implementation",
              "+critic.model.override_config.attn_implementation")


def check_flash_attn_needs(job: JobSpec, flash: Optional[bool], note: str) -> list[Finding]:
    """What verl cannot do without flash-attn, on nodes that lack it (`flash` False; None: unknown, silent).
    verl (0.9.1 read) loads a critic's value model with attn_implementation="flash_attention_2" whatever
    critic.model.override_config says, so a GAE job fails at the critic's init an hour's setup in; and a job
    that pins use_remove_padding or a flash attention keeps what the plan would have switched off."""
    if flash is not False or not job.is_ray_only:  # verl trainers only
        return []
    from verl_cluster.placement.settings import read_settings

    out = []
    s = read_settings(job)
    if s.critic:
        out.append(Finding(
            "error", "verl-config",
            f"{job.source}: algorithm.adv_estimator={s.adv_estimator} trains a critic, and verl loads the critic's "
            f"value model with attn_implementation=flash_attention_2 whatever critic.model.override_config says; "
            f"{note}",
            "install flash-attn on every node (built for the nodes' torch and CUDA), or train without a critic: "
            "algorithm.adv_estimator=grpo (launch/gsm8k_grpo.yaml)"))
    own = job.verl_overrides()
    for key in FLASH_KEYS:
        if key.startswith(("critic", "+critic")) and not s.critic or key not in own:
            continue
        v = own[key]
        if "attn_implementation" in key and str(v).startswith("flash") or v is True or str(v).lower() == "true":
            why = "verl's padding-free path needs flash-attn's varlen kernels" if "padding" in key else \
                "transformers cannot load it"
            out.append(Finding("error", "verl-config", f"{key_origin(job, key)}: {key} is {v}, but {note} ({why})",
                               f"remove {key}: without flash-attn the plan sets sdpa attention and turns "
                               "use_remove_padding off; or install flash-attn on every node"))
    return out


# ---- sequence lengths: what the plan was made for ----
def prompt_findings(job: JobSpec, stats: Any) -> list[Finding]:
    """The measured training prompts (placement.lengths.PromptStats) against data.max_prompt_length: verl 0.9
    drops longer ones when data.filter_overlong_prompts is on, else its agent loop left-truncates them (older verl
    with data.truncation=error stops at the first)."""
    flt = job.get("data.filter_overlong_prompts", False)
    flt = flt is True or str(flt).lower() == "true"
    files = ", ".join(stats.files)
    where = f"{files}: prompts {stats.mean:.0f} tokens on average (p50 {stats.p50}, p95 {stats.p95}, max {stats.max})"
    if not stats.over_limit:
        return [Finding("ok", "data", f"{where}, all within data.max_prompt_length={stats.limit}")]
    share = f"{stats.over_limit} of {stats.sampled} sampled prompts ({stats.over_limit / stats.sampled:.0%})"
    if flt and stats.over_limit == stats.sampled:
        return [Finding("error", "data", f"{where}: every sampled prompt is longer than data.max_prompt_length="
                                         f"{stats.limit}, and data.filter_overlong_prompts drops them all",
                        f"raise data.max_prompt_length (p95 is {stats.p95}, the longest {stats.max})")]
    if flt:
        return [Finding("warning", "data", f"{where}: {share} are longer than data.max_prompt_length={stats.limit}; "
                                           "verl drops them when it loads the data (data.filter_overlong_prompts)",
                        f"raise data.max_prompt_length to keep them (p95 {stats.p95}, longest {stats.max})")]
    return [Finding("warning", "data", f"{where}: {share} are longer than data.max_prompt_length={stats.limit}; "
                                       "verl 0.9 cuts them to their last tokens (its agent loop left-truncates, with "
                                       "a warning each; older verl with data.truncation=error stops)",
                    f"set data.filter_overlong_prompts=true to drop them, or raise data.max_prompt_length "
                    f"(p95 {stats.p95}, longest {stats.max})")]


def lengths_findings(job: JobSpec, lengths: Any, notes: Sequence[str] = (), plans: Any = None) -> list[Finding]:
    """Findings of the lengths known (placement.lengths.Lengths): what could not be measured and the prompts
    measured; of the plans made at them (LengthPlans), the warning that names them when only they make it fit."""
    out = [Finding("skipped", "data", n) for n in notes]
    if lengths is not None and lengths.prompts is not None:
        out += prompt_findings(job, lengths.prompts)
    if plans is not None and plans.verdict == "fits-at-known-lengths":
        out.append(Finding("warning", "placement", plans.warning(),
                           f"`verl-cluster plan {job.source}` shows both plans; `submit --watch` keeps the run up"))
    return out


def run_preflight(spec: ClusterSpec, job: JobSpec, overrides: Mapping[str, Any], status: Any,
                  extra: Sequence[Finding] = ()) -> PreflightReport:
    """Every check; the report carries the paths to send verl as the nodes expand them."""
    from verl_cluster.submit.hygiene import checkpoint_dir_findings
    from verl_cluster.submit.shared_queue import check_shared_host, check_shared_queue

    findings = list(extra)
    paths: dict[str, Any] = {}

    def nodes() -> list[Finding]:
        found, rewrites = check_nodes(spec, job, overrides)
        paths.update(rewrites)
        return found

    def queue() -> list[Finding]:  # only where the job goes to the cluster's Ray (status came back)
        return check_shared_queue(spec, job, overrides) + check_shared_host(job, status) if status is not None else []

    def guarded(check) -> list[Finding]:
        try:
            return check()
        except Exception as e:  # noqa: BLE001 - one broken check must not hide the others
            return [Finding("error", "preflight", f"check failed: {type(e).__name__}: {e}")]

    checks = (nodes, lambda: check_verl(job, overrides, spec), lambda: checkpoint_dir_findings(job, overrides),
              lambda: check_resources(job, overrides, status), lambda: check_placement_strategy(spec, job), queue)
    # side by side: verl's config probe (a child Python importing verl: ~30 s on a GPU box) need not wait for the
    # nodes' SSH probes; each check reads only its inputs (the nodes' path rewrites are used after, by the submit)
    with ThreadPoolExecutor(len(checks)) as pool:
        for got in pool.map(guarded, checks):
            findings += got
    return PreflightReport(findings, paths)
