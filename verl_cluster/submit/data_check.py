"""Does a parquet file have the columns verl will read? Pure checks on a schema tree.

A schema tree is plain JSON (so a node can send it back): {column: type}, where a type is
{"kind": "string"|"int"|"float"|"bool"|"other"}, {"kind": "list", "item": type} or
{"kind": "struct", "fields": {name: type}}. `schema_tree(pyarrow_schema)` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from verl_cluster.config.job import is_verl_trainer

RL_KNOWN = ("prompt", "data_source", "reward_model", "ability", "extra_info")


@dataclass(frozen=True)
class DataRequirement:
    """What one trainer reads: columns that must exist, with the check for each."""

    kind: str  # "rl" or "sft"
    prompt_key: str
    response_key: str | None = None
    needs_ground_truth: bool = True
    known: tuple[str, ...] = ()


def requirement_for(entrypoint: str | None, overrides: Mapping[str, Any]) -> DataRequirement | None:
    """The data contract of a verl entrypoint, from its overrides; None for programs we know nothing about."""
    ep = entrypoint or ""
    if "fsdp_sft_trainer" in ep:  # verl < 0.6: prompt/response columns (or multiturn messages)
        if overrides.get("data.multiturn.enable"):
            key = str(overrides.get("data.multiturn.messages_key", "messages"))
            return DataRequirement("sft", key, None, False, (key,))
        p = str(overrides.get("data.prompt_key", "question"))
        r = str(overrides.get("data.response_key", "answer"))
        return DataRequirement("sft", p, r, False, (p, r))
    if "sft_trainer" in ep:  # verl 0.9 sft_trainer(_ray): chat messages
        key = str(overrides.get("data.messages_key", "messages"))
        return DataRequirement("sft", key, None, False, (key, "tools", "enable_thinking"))
    if is_verl_trainer(ep):
        custom_reward = any(overrides.get(k) for k in (
            "custom_reward_function.path", "reward.custom_reward_function.path", "reward_model.enable"))
        p = str(overrides.get("data.prompt_key", "prompt"))
        return DataRequirement("rl", p, None, not custom_reward, (p,) + RL_KNOWN[1:])
    return None


def _is_messages(t: Mapping) -> bool:
    if t.get("kind") != "list":
        return False
    item = t.get("item") or {}
    fields = item.get("fields") or {}
    return item.get("kind") == "struct" and "role" in fields and "content" in fields


def _describe(t: Mapping) -> str:
    k = t.get("kind", "?")
    if k == "list":
        return f"list<{_describe(t.get('item') or {})}>"
    if k == "struct":
        return "struct<" + ",".join(t.get("fields") or {}) + ">"
    return k


def check_schema(file: str, schema: Mapping[str, Mapping], req: DataRequirement) -> list[str]:
    """Problems (one line each, naming the file) with this file for this trainer; [] when it fits."""
    cols = set(schema)
    problems: list[str] = []
    missing: list[str] = []
    if req.prompt_key not in cols:
        missing.append(req.prompt_key)
    elif req.response_key is None and not _is_messages(schema[req.prompt_key]):
        problems.append(f"{file}: column `{req.prompt_key}` is {_describe(schema[req.prompt_key])}, verl's "
                        f"{req.kind.upper()} data needs chat messages: list<struct<role,content>>")
    if req.kind == "sft" and req.response_key and req.response_key not in cols:
        missing.append(req.response_key)
    if req.kind == "rl":
        if "data_source" not in cols:
            missing.append("data_source")
        if req.needs_ground_truth:
            rm = schema.get("reward_model")
            if rm is None:
                missing.append("reward_model.ground_truth")
            elif "ground_truth" not in (rm.get("fields") or {}):
                missing.append("reward_model.ground_truth")
    if missing:
        extra = sorted(cols - set(req.known))
        msg = f"{file}: missing column{'s' if len(missing) > 1 else ''} {', '.join(f'`{m}`' for m in missing)}"
        msg += f" (verl {req.kind.upper()} data needs {', '.join(req.known)})"
        if extra:
            msg += f"; extra columns: {', '.join(extra)}"
        problems.insert(0, msg)
    return problems


def schema_tree(schema: Any) -> dict[str, dict]:
    """pyarrow.Schema -> schema tree."""
    from verl_cluster.submit.node_files import type_tree

    return {f.name: type_tree(f.type) for f in schema}
