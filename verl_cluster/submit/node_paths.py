"""Paths verl opens on the nodes, sent to verl as every node expands them.

verl (0.9.1 read) opens the paths of its config as written: `data.train_files=[~/data/train.parquet]` reaches
`datasets.load_dataset("parquet", ...)` as `<working dir>/~/data/train.parquet` (FileNotFoundError), a model folder
`~/models/x` is taken for a hub name, and a checkpoint folder `~/ckpt` is made under the job's working directory.
The TaskRunner that reads the data and the workers may run on any node, so preflight expands `~` and `$VAR` on
every node (node_files.expansion, in the environment the job gets there) and submit sends the one absolute path
they agree on. Nodes that expand a path differently (another HOME, another value of the variable) are refused.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from verl_cluster.submit.findings import Finding

REMOTE_SCHEMES = ("hdfs://", "s3://", "gs://", "http://", "https://")

# verl keys (0.9.1's ppo_trainer and sft_trainer configs) whose values are paths opened on the nodes
PATH_KEYS = (
    "data.train_files", "data.val_files", "data.custom_cls.path", "data.tool_config_path",
    "data.function_tool_path",
    "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "actor_rollout_ref.model.hf_config_path",
    "actor_rollout_ref.model.lora_adapter_path", "actor_rollout_ref.model.lora.adapter_path",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path", "actor_rollout_ref.rollout.multi_turn.function_tool_path",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path",
    "critic.model.path", "critic.model.tokenizer_path", "critic.model.hf_config_path",
    "critic.model.lora_adapter_path", "critic.model.lora.adapter_path",
    "reward_model.model.path", "reward_model.model.input_tokenizer", "reward.reward_model.model_path",
    "custom_reward_function.path", "reward.custom_reward_function.path",
    "trainer.default_local_dir", "trainer.resume_from_path", "trainer.rollout_data_dir",
    "trainer.validation_data_dir",
    "model.path", "model.partial_pretrain", "model.tokenizer_path",  # verl's SFT trainers
)


def needs_expanding(value: Any) -> bool:
    """A local path starting with `~` or holding a `$VAR` (verl would open it as written); OmegaConf's `${...}`
    is verl's to resolve."""
    return isinstance(value, str) and not value.startswith(REMOTE_SCHEMES) and (
        value.startswith("~") or re.search(r"\$\w", value) is not None)


def to_expand(overrides: Mapping[str, Any]) -> dict[str, list[str]]:
    """{key as given: its values that need expanding} for the path keys among `overrides`."""
    out: dict[str, list[str]] = {}
    for key, value in overrides.items():
        if key.lstrip("+") not in PATH_KEYS:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        found = [v for v in values if needs_expanding(v)]
        if found:
            out[key] = found
    return out


def job_env(job: Any) -> dict[str, str]:
    """The job's own environment (runtime_env's env_vars, then `env`), secrets left out: they never leave this
    machine for a probe, and a path does not hide in one."""
    return {**{str(k): str(v) for k, v in (job.runtime_env.get("env_vars") or {}).items()},
            **{str(k): str(v) for k, v in job.env.items()}}


def node_env(spec: Any, node: Any, job: Any) -> dict[str, str]:
    """What the job's processes on `node` start with beyond the login environment: the Ray daemons' env (`up`
    starts them with ray.env and the node's env) and the job's."""
    return {**spec.ray.env, **node.env, **job_env(job)}


def _check(key: str) -> str:
    """The preflight check a key's path belongs to (all three mean bad input, exit 2)."""
    bare = key.lstrip("+")
    if bare.startswith("data."):
        return "data"
    return "model" if ".model." in f".{bare}" or bare.endswith("model_path") else "verl-config"


def judge(overrides: Mapping[str, Any], results: Mapping[str, Any]) -> tuple[dict[str, Any], list]:
    """(the overrides to replace: key -> its value with each path as every node expands it, findings) from the
    node probes ({host: probe JSON or an exception}). Nothing is replaced while a node could not be asked (that
    is an error of its own) or where the nodes disagree (an error here)."""
    wanted = to_expand(overrides)
    if not wanted or any(isinstance(r, BaseException) for r in results.values()):
        return {}, []
    out: list = []
    done: dict[str, str] = {}
    for key, raws in wanted.items():
        for raw in raws:
            seen = {host: (res.get("expanded") or {}).get(raw) for host, res in results.items()}
            if not seen or any(v is None for v in seen.values()):
                continue  # a probe that did not expand it: nothing to judge
            problem = _disagreement(key, raw, seen)
            if problem:
                out.append(Finding("error", _check(key), *problem))
            else:
                done[raw] = next(iter(seen.values()))["path"]
    if done:
        out.append(Finding("ok", "paths", "sent to verl as every node expands them: "
                                          + "; ".join(f"{raw} -> {path}" for raw, path in done.items())))
    return rewritten(overrides, done), out


def _disagreement(key: str, raw: str, seen: Mapping[str, Mapping[str, Any]]) -> tuple[str, str] | None:
    """(message, hint) when `raw` has no one expansion on the nodes, else None."""
    unset = sorted({v for e in seen.values() for v in e.get("unset") or ()})
    if unset:
        hosts = [h for h, e in seen.items() if e.get("unset")]
        names = ", ".join(f"${v}" for v in unset)
        return (f"{key}: `{raw}` uses {names}, not set on {', '.join(hosts)}",
                f"set it in the job's env (env: {{{unset[0]}: ...}}), or write the absolute path")
    tilde = [h for h, e in seen.items() if str(e["path"]).startswith("~")]
    if tilde:
        return (f"{key}: `{raw}`: `~` has no home folder to stand for on {', '.join(tilde)}",
                "write the absolute path")
    by_path: dict[str, list[str]] = {}
    for host, e in seen.items():
        by_path.setdefault(str(e["path"]), []).append(host)
    if len(by_path) > 1:
        where = "; ".join(f"{p} on {', '.join(hosts)}" for p, hosts in by_path.items())
        return (f"{key}: `{raw}` is a different path on each node ({where}): verl would read another file on "
                "each", f"write one absolute path that every node has, e.g. {key.lstrip('+')}={next(iter(by_path))}")
    return None


def rewritten(overrides: Mapping[str, Any], done: Mapping[str, str]) -> dict[str, Any]:
    """The path keys of `overrides` whose values change under `done` (raw path -> expansion), changed."""
    out: dict[str, Any] = {}
    for key in to_expand(overrides):
        value = overrides[key]
        new = [done.get(v, v) if isinstance(v, str) else v for v in value] if isinstance(value, (list, tuple)) \
            else done.get(value, value)
        if new != value:
            out[key] = new
    return out


def unexpanded(overrides: Mapping[str, Any]) -> list:
    """Warnings for the paths sent as written, not expanded on every node (no node answered, or they disagree)."""
    return [Finding("warning", _check(key), f"{key}: {', '.join(raws)} sent to verl as written, not expanded on "
                                            "every node; verl does not expand `~` or `$VAR`",
                    "write the absolute path")
            for key, raws in to_expand(overrides).items()]
