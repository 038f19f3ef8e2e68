"""Model shape: the config.json numbers the memory model needs, from a config.json given by path
(`--model-config FILE`), a local HF dir or the shipped catalog.

Parameter counts are computed from the shape (decoder-only, GQA attention, gated MLP, RMSNorm), so a
catalog entry and a local config.json give the same numbers; tests check them against published sizes.
Dense models only: a mixture-of-experts model is refused by name (its experts are not in the memory model).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from verl_cluster.errors import ConfigError

CATALOG_DIR = Path(__file__).resolve().parent.parent / "catalog"  # shipped as package data


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    head_dim: int = 0  # 0: hidden // heads (Qwen3 sets it explicitly)
    qkv_bias: bool = False  # Qwen2/2.5 have q/k/v biases
    qk_norm: bool = False  # Qwen3 normalises q and k per head
    max_position: int = 0
    sandwich_norms: bool = False  # Gemma 2/3: a norm before and after attention and MLP (4 per layer, not 2)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    @property
    def q_dim(self) -> int:
        return self.heads * self.hd

    @property
    def layer_params(self) -> int:
        """One decoder layer: attention (q,k,v,o [+ biases, q/k norms]), gated MLP, two RMSNorms."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.qk_norm:
            attn += 2 * self.hd
        mlp = 3 * h * self.intermediate
        return attn + mlp + (4 if self.sandwich_norms else 2) * h

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """What FSDP keeps in the root unit (not a decoder layer): embeddings, lm_head, final norm."""
        return self.embed_params * (1 if self.tied_embeddings else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @property
    def value_root_params(self) -> int:
        """The value model's root unit: embeddings, final norm and the hidden x 1 score head (no lm_head)."""
        return self.embed_params + self.hidden + self.hidden

    @property
    def value_model_params(self) -> int:
        """verl's critic / reward model: the LM with its lm_head replaced by a hidden x 1 score head."""
        return self.layers * self.layer_params + self.value_root_params

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each Linear in a decoder layer, by the HF module name peft targets."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def lora_params(self, rank: int, targets: tuple[str, ...] = ("all-linear",)) -> int:
        """peft LoRA adapters (A: in x r, B: r x out) on the targeted Linears of every decoder layer.
        peft's "all-linear" is every Linear but the output layer (lm_head)."""
        dims = self.linear_dims()
        names = list(dims) if "all-linear" in targets else [t for t in targets if t in dims]
        return self.layers * sum(rank * (dims[n][0] + dims[n][1]) for n in names)

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """KV cache per token per GPU: 2 (K and V) x layers x kv_heads/TP x head_dim x dtype bytes.
        vLLM replicates KV heads when TP > kv_heads, so a GPU never holds less than one head."""
        heads_per_gpu = max(1, math.ceil(self.kv_heads / tp))
        return 2 * self.layers * heads_per_gpu * self.hd * dtype_bytes


def _shape_from_entry(name: str, e: dict[str, Any]) -> ModelShape:
    return ModelShape(
        name=name, hidden=int(e["hidden"]), layers=int(e["layers"]), heads=int(e["heads"]),
        kv_heads=int(e.get("kv_heads") or e["heads"]), intermediate=int(e["intermediate"]), vocab=int(e["vocab"]),
        tied_embeddings=bool(e.get("tied", False)), head_dim=int(e.get("head_dim") or 0),
        qkv_bias=bool(e.get("qkv_bias", False)), qk_norm=bool(e.get("qk_norm", False)),
        max_position=int(e.get("max_position") or 0), sandwich_norms=bool(e.get("sandwich_norms", False)),
    )


@lru_cache(maxsize=1)
def _catalog_file() -> dict[str, Any]:
    return json.loads((CATALOG_DIR / "models.json").read_text())


def catalog() -> dict[str, dict[str, Any]]:
    return {k: v for k, v in _catalog_file().items() if not k.startswith("_")}


@lru_cache(maxsize=1)
def _by_name() -> dict[str, str]:
    """Every name a catalog entry answers to (lower case): its key, its hub repo and aliases, with and without
    the organisation (Qwen/Qwen2-7B-Instruct, Qwen2-7B-Instruct)."""
    out: dict[str, str] = {}
    for key, e in catalog().items():
        for n in [e["hf"], *e.get("aliases", [])]:
            out.setdefault(n.lower(), key)
            out.setdefault(n.lower().split("/")[-1], key)
        out[key] = key
    return out


def moe_name(name: str) -> bool:
    """Does the name say mixture-of-experts (Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V3, ...)? The patterns are in
    the catalog file (`_moe`)."""
    low = name.strip().lower()
    return any(re.search(p, low) for p in _catalog_file().get("_moe", {}).get("patterns", []))


def moe_error(name: str, field_name: str) -> ConfigError:
    return ConfigError(f"{field_name}: `{name}` is a mixture-of-experts model; the planner models dense models only "
                       "(experts, routing and expert parallelism are not in its memory model)",
                       "plan it by hand (verl-cluster submit runs the job's own settings without a plan), or "
                       "plan a dense model of similar active size with model.catalog=NAME")


def catalog_shape(name: str) -> ModelShape:
    raw = name.strip()
    key = _by_name().get(raw.lower()) or _by_name().get(raw.lower().split("/")[-1])
    entries = catalog()
    if key is None:
        if moe_name(raw):
            raise moe_error(raw, "model.catalog")
        near = difflib.get_close_matches(raw.lower(), list(entries), n=1, cutoff=0.5)
        raise ConfigError(f"model.catalog: unknown model `{name}`",
                          f"did you mean `{near[0]}`?" if near else f"known: {', '.join(sorted(entries))}")
    return _shape_from_entry(key, entries[key])


# HF config.json field names across the Llama/Qwen/Mistral family.
_FIELDS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "intermediate": ("intermediate_size", "ffn_dim"),
    "vocab": ("vocab_size",),
}


def shape_from_hf_config(cfg: dict[str, Any], name: str = "config.json") -> ModelShape:
    """Read the decoder shape out of an HF config.json. MoE configs are refused (not modelled)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{name}: expected a JSON object")
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "tie_word_embeddings": cfg.get("tie_word_embeddings",
                                                                     cfg["text_config"].get("tie_word_embeddings"))}
    if any(cfg.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        raise ConfigError(f"{name}: mixture-of-experts models are not modelled by the planner (experts, routing and "
                          "expert parallelism are not in its memory model)",
                          "plan a dense model of similar active size, or set the placement by hand")
    got: dict[str, int] = {}
    for field_name, keys in _FIELDS.items():
        for k in keys:
            if isinstance(cfg.get(k), int):
                got[field_name] = cfg[k]
                break
        else:
            raise ConfigError(f"{name}: missing `{keys[0]}`; cannot compute the model's shape")
    model_type = str(cfg.get("model_type", ""))
    gemma = model_type.startswith("gemma")  # transformers' Gemma configs tie the embeddings unless told otherwise
    return ModelShape(
        name=str(cfg.get("_name_or_path") or name),
        hidden=got["hidden"], layers=got["layers"], heads=got["heads"],
        kv_heads=int(cfg.get("num_key_value_heads") or got["heads"]),
        intermediate=got["intermediate"], vocab=got["vocab"],
        tied_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
        head_dim=int(cfg.get("head_dim") or 0),
        qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type.startswith(("qwen3", "gemma3")),
        max_position=int(cfg.get("max_position_embeddings") or 0),
        sandwich_norms=model_type.startswith(("gemma2", "gemma3")),
    )


CONFIG_MAX_BYTES = 1 << 20  # a config.json is a few KB; more is not one


def shape_from_file(path: str | os.PathLike, field_name: str = "--model-config") -> ModelShape:
    """A model's shape from its config.json given by path (`--model-config FILE`, `model.config`)."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_dir():
        p = p / "config.json"
    where = f"{field_name} {p}"
    try:
        if not p.is_file():
            raise ConfigError(f"{where}: no such file", "give the model's config.json (from its Hugging Face repo)")
        if p.stat().st_size > CONFIG_MAX_BYTES:
            raise ConfigError(f"{where}: larger than 1 MiB, not a model's config.json")
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: invalid JSON: {e.msg} (line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    shape = shape_from_hf_config(cfg, where)
    return shape if shape.name != where else ModelShape(**{**shape.__dict__, "name": str(path)})


def shape_from_dir(path: str | os.PathLike) -> ModelShape:
    p = Path(os.path.expanduser(str(path))) / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: invalid JSON: {e.msg} (line {e.lineno})")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror or e}")
    shape = shape_from_hf_config(cfg, str(p))
    return shape if shape.name != str(p) else ModelShape(**{**shape.__dict__, "name": str(path)})


def resolve_shape(path: Optional[str], catalog_name: Optional[str], config: Optional[str] = None) -> ModelShape:
    """The config.json given by path wins (`--model-config`, what the user said); then a local model dir with
    config.json (the real thing); else the catalog; else the path's name looked up in the catalog (its hub
    repo, base/instruct aliases: Qwen/Qwen2-7B-Instruct). A mixture-of-experts name is refused as such."""
    if config:
        return shape_from_file(config)
    if path:
        local = Path(os.path.expanduser(path))
        if (local / "config.json").is_file():
            return shape_from_dir(local)
    if catalog_name:
        return catalog_shape(catalog_name)
    if path:
        base = path.rstrip("/").split("/")[-1]
        if moe_name(path):
            raise moe_error(path, "model.path")
        try:
            return catalog_shape(path if path.count("/") == 1 else base)
        except ConfigError:
            names = _by_name()
            near = difflib.get_close_matches(base.lower(), list(names), n=1, cutoff=0.5)
            like = names[near[0]] if near else "qwen2.5-7b"
            raise ConfigError(f"model.path: `{path}` has no config.json here and is not in the catalog",
                              "give its config.json: --model-config FILE (the file from the model's Hugging Face "
                              f"repo), or set model.catalog to a model of the same shape (e.g. model.catalog={like}), "
                              "or point model.path at a local folder with its config.json") from None
    raise ConfigError("model: set `model.path` (a local HF dir) or `model.catalog` (e.g. qwen2.5-0.5b)",
                      "or give the model's config.json: --model-config FILE")


def parse_size(text: str) -> float:
    """'494M' -> 494e6, '1.54B' -> 1.54e9 (the way model cards state sizes)."""
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(t[-1:], 1.0)
    return float(t[:-1] if t[-1:] in "KMBT" else t) * mult
