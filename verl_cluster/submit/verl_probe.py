"""Compose verl's Hydra config with a job's overrides and run verl's own validation (no GPU needed).

Runs in a child Python (`python verl_probe.py JSON`) so verl's imports (torch, logging setup) stay out of
the CLI. Prints one MARK line: {"unknown": [[key, nearest]], "error": str|None, "validated": bool, "skipped": str}.
"""

import difflib
import json
import os
import re
import socket
import sys
import threading
from urllib.parse import urlsplit

MARK = "@@VC-JSON@@"
HUB_TIMEOUT_S = 3.0


def hub_reachable(timeout=HUB_TIMEOUT_S):
    """Can this machine open a connection to the Hugging Face Hub (or $HF_ENDPOINT) within `timeout`? Name
    resolution included: offline, a resolver can stall far longer than any connect timeout."""
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    ok = []

    def attempt():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)


def stay_offline_if_hub_unreachable(overrides):
    """verl's validation loads the model's config.json; for a Hub id that is not on disk, transformers retries
    an unreachable Hub for about a minute. Decide once, quickly, before anything imports huggingface_hub."""
    if "HF_HUB_OFFLINE" in os.environ:
        return None
    paths = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].endswith("model.path") and "=" in o]
    if all(os.path.exists(os.path.expanduser(p)) for p in paths) or hub_reachable():
        return None
    os.environ["HF_HUB_OFFLINE"] = "1"
    return "the Hugging Face Hub is not reachable from here"


def config_name_of(module):
    """The config_name of the module's @hydra.main, read from its source."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return None, None
    src = open(spec.origin).read()
    m = re.search(r"@hydra\.main\(([^)]*)\)", src)
    if not m:
        return None, None
    name = re.search(r"config_name\s*=\s*[\"']([^\"']+)", m.group(1))
    path = re.search(r"config_path\s*=\s*[\"']([^\"']+)", m.group(1))
    base = os.path.dirname(spec.origin)
    return (name.group(1) if name else None), os.path.join(base, path.group(1) if path else "config")


def all_keys(cfg, prefix=""):
    from omegaconf import DictConfig

    out = []
    for k in cfg.keys():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.append(key)
        try:
            v = cfg._get_node(k)
        except Exception:
            continue
        if isinstance(v, DictConfig) and not v._is_missing() and not v._is_none():
            out += all_keys(v, key)
    return out


def has_key(cfg, key):
    """Is `a.b.c` a key of the config? (OmegaConf.select and `in` treat mandatory `???` values as absent.)"""
    from omegaconf import DictConfig

    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing() or part not in list(node.keys()):
            return False
        node = node._get_node(part)
    return True


def nearest(key, keys):
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    siblings = [k for k in keys if k.rsplit(".", 1)[0] == parent] if parent else keys
    for pool in (siblings, keys):
        m = difflib.get_close_matches(key, pool, n=1, cutoff=0.6)
        if m:
            return m[0]
    return None


def main(arg):
    import importlib.util

    req = json.loads(arg)
    out = {"unknown": [], "error": None, "validated": False, "skipped": None}
    if importlib.util.find_spec("verl") is None:  # run on a node whose Python lacks verl: say so, no traceback
        out.update(no_verl=True, skipped=f"verl is not installed in {sys.executable}: its config was not checked")
        print(MARK + json.dumps(out))
        return
    offline = stay_offline_if_hub_unreachable(req["overrides"])
    from hydra import compose, initialize_config_dir

    name, cfg_dir = config_name_of(req["module"])
    # the job's --config-name/--config-path (Hydra's flags; a relative path is the module's folder's, as in Hydra)
    if req.get("config_name"):
        name = req["config_name"][:-5] if req["config_name"].endswith(".yaml") else req["config_name"]
    if req.get("config_path"):
        base = os.path.dirname(cfg_dir) if cfg_dir else ""
        cfg_dir = os.path.normpath(os.path.join(base, req["config_path"]))
        if not os.path.isdir(cfg_dir):
            out["skipped"] = f"--config-path {req['config_path']}: {cfg_dir} is not a folder here; config not checked"
            print(MARK + json.dumps(out))
            return
    if not name:
        out["skipped"] = f"{req['module']} has no @hydra.main config"
        print(MARK + json.dumps(out))
        return
    overrides = req["overrides"]
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        base = compose(config_name=name)
        keys = all_keys(base)
        for item in overrides:
            key = item.split("=", 1)[0]
            if key.startswith(("+", "~")):
                continue
            if not has_key(base, key):
                out["unknown"].append([key, nearest(key, keys)])
        if out["unknown"]:
            print(MARK + json.dumps(out))
            return
        try:
            cfg = compose(config_name=name, overrides=overrides)
        except Exception as e:
            out["error"] = " ".join(str(e).split())[:400]
            print(MARK + json.dumps(out))
            return
    if req["module"].startswith("verl.trainer.main_ppo"):
        try:
            from verl.trainer.main_ppo import need_critic, need_reference_policy
            from verl.utils.config import validate_config

            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
            out["validated"] = True
        except (FileNotFoundError, OSError) as e:
            out["skipped"] = f"verl's validation needs local model files: {str(e).splitlines()[0][:200]}"
        except Exception as e:
            msg = " ".join(str(e).split())
            if any(m in msg for m in ("config.json", "does not appear to have a file", "Repo id", "huggingface.co",
                                      "offline mode", "HFModelConfig")):
                why = f" ({offline})" if offline else ""
                out["skipped"] = f"verl's validation needs the model's config.json locally{why}: {msg[:200]}"
            else:
                out["error"] = msg[:400]
    else:
        out["skipped"] = "verl's validate_config applies to main_ppo only"
    print(MARK + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
