"""Compose verl's Hydra config with a job's overrides and run verl's own validation (no GPU needed).

Runs in a child Python (`python verl_probe.py JSON`) so verl's imports (torch, logging setup) stay out of
the CLI. Prints one MARK line: {"unknown": [[key, nearest]], "error": str|None, "validated": bool, "skipped": str,
"cached": str|None}.

Importing verl's trainer to validate takes seconds (5 s on 2 CPU cores, more on a GPU machine) at every submit. An
answer is kept in ~/.verl-cluster/cache/verl-probe on the machine that ran it, under a key of everything it read:
the Python, verl's version, every file of verl's package (count, newest time, total size: an edited install asks
again), the job's config folder when it is not verl's, each model's config.json, the request and the Hub
variables. The same key within a week gives the same answer without importing verl; answers that depend on the
network or a missing file (skipped) are never kept. VC_VERL_PROBE_CACHE=0 turns it off.
"""

import difflib
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

MARK = "@@VC-JSON@@"
HUB_TIMEOUT_S = 3.0
CACHE_S = 7 * 24 * 3600  # an answer older than this is asked again
CACHE_KEEP = 200  # answers kept, newest first
HUB_VARS = ("HF_HUB_OFFLINE", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE")


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


def module_file(module):
    """The source file of a module of verl's, found without importing verl (its __init__ imports torch)."""
    import importlib.util

    top = importlib.util.find_spec("verl") if module.startswith("verl.") else None
    if top is not None and top.origin:
        base = os.path.join(os.path.dirname(top.origin), *module.split(".")[1:])
        found = next((f for f in (base + ".py", os.path.join(base, "__init__.py")) if os.path.isfile(f)), None)
        if found:
            return found
    try:  # another module, or verl laid out otherwise: the import system finds it (importing its parents)
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec and spec.origin else None


def config_name_of(module):
    """(config_name of the module's @hydra.main, its config folder, the module's file), read from its source."""
    origin = module_file(module)
    if not origin:
        return None, None, None
    src = open(origin).read()
    m = re.search(r"@hydra\.main\(([^)]*)\)", src)
    if not m:
        return None, None, origin
    name = re.search(r"config_name\s*=\s*[\"']([^\"']+)", m.group(1))
    path = re.search(r"config_path\s*=\s*[\"']([^\"']+)", m.group(1))
    base = os.path.dirname(origin)
    return (name.group(1) if name else None), os.path.join(base, path.group(1) if path else "config"), origin


def config_dir(req):
    """(config name, folder, the module's file) the request composes: the module's @hydra.main, or the job's
    --config-name/-path (a relative path is the module's folder's, as in Hydra)."""
    name, cfg_dir, origin = config_name_of(req["module"])
    if req.get("config_name"):
        name = req["config_name"][:-5] if req["config_name"].endswith(".yaml") else req["config_name"]
    if req.get("config_path"):
        base = os.path.dirname(cfg_dir) if cfg_dir else ""
        cfg_dir = os.path.normpath(os.path.join(base, req["config_path"]))
    return name, cfg_dir, origin


def stamp(path):
    try:
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return None


def tree_stamp(top):
    """[files, newest mtime, total size] of a folder's files (a few ms for verl's ~400): any edit changes it."""
    n = newest = size = 0
    for d, dirs, fs in os.walk(top):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in fs:
            st = stamp(os.path.join(d, f))
            if st:
                n, size, newest = n + 1, size + st[0], max(newest, st[1])
    return [n, newest, size]


def cache_key(req, where, verl):
    """What the answer depends on, hashed; None when it cannot be told without importing verl. WHERE: config_dir's
    answer for REQ; VERL: verl's package folder."""
    from importlib import metadata

    name, cfg_dir, origin = where
    if not name or not cfg_dir or not origin or not os.path.isdir(cfg_dir) or not verl:
        return None
    models = [o.split("=", 1)[1] for o in req["overrides"] if "=" in o and o.split("=", 1)[0].endswith("model.path")]
    try:
        version = metadata.version("verl")
    except metadata.PackageNotFoundError:
        version = None
    what = {"python": sys.executable, "verl": version, "req": req, "verl_files": tree_stamp(verl),
            "config": tree_stamp(cfg_dir) if not cfg_dir.startswith(verl + os.sep) else None, "module": stamp(origin),
            "models": [[m, stamp(os.path.join(os.path.expanduser(m), "config.json"))] for m in models],
            "env": {k: os.environ.get(k) for k in HUB_VARS}}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def cache_folder():
    return os.path.join(os.path.expanduser("~"), ".verl-cluster", "cache", "verl-probe")


def cached(key):
    try:
        with open(os.path.join(cache_folder(), key + ".json")) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    if time.time() - doc.get("time", 0) > CACHE_S:
        return None
    return dict(doc["out"], cached=time.strftime("%Y-%m-%d %H:%M", time.localtime(doc["time"])))


def keep(key, out):
    """Store an answer that only the key's inputs decide (never one skipped: the Hub, a missing file); prune old."""
    if out.get("skipped") or not (out["validated"] or out["unknown"] or out["error"]):
        return
    folder = cache_folder()
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = os.path.join(folder, f".{key}.{os.getpid()}")
        with open(tmp, "w") as fh:
            json.dump({"time": time.time(), "out": out}, fh)
        os.replace(tmp, os.path.join(folder, key + ".json"))
        kept = sorted((os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json")),
                      key=os.path.getmtime, reverse=True)
        for old in kept[CACHE_KEEP:]:
            os.unlink(old)
    except OSError:  # a read-only or full home: the answer is still right, only not kept
        pass


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
    verl = importlib.util.find_spec("verl")
    if verl is None:  # run on a node whose Python lacks verl: say so, no traceback
        print(MARK + json.dumps({"unknown": [], "error": None, "validated": False, "no_verl": True,
                                 "skipped": f"verl is not installed in {sys.executable}: its config was not checked"}))
        return
    where = config_dir(req)  # read once: the key and the probe both go by it
    use_cache = os.environ.get("VC_VERL_PROBE_CACHE", "1") != "0"
    key = cache_key(req, where, os.path.dirname(verl.origin) if verl.origin else None) if use_cache else None
    out = cached(key) if key else None
    if out is None:
        out = probe(req, where)
        if key:
            keep(key, out)
    print(MARK + json.dumps(out))


def probe(req, where):
    """Compose verl's config with the request's overrides and validate it (imports verl's trainer). WHERE:
    config_dir's answer for REQ."""
    out = {"unknown": [], "error": None, "validated": False, "skipped": None}
    offline = stay_offline_if_hub_unreachable(req["overrides"])
    from hydra import compose, initialize_config_dir

    name, cfg_dir, _ = where
    if req.get("config_path") and not os.path.isdir(cfg_dir):
        out["skipped"] = f"--config-path {req['config_path']}: {cfg_dir} is not a folder here; config not checked"
        return out
    if not name:
        out["skipped"] = f"{req['module']} has no @hydra.main config"
        return out
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
            return out
        try:
            cfg = compose(config_name=name, overrides=overrides)
        except Exception as e:
            out["error"] = " ".join(str(e).split())[:400]
            return out
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
    return out


if __name__ == "__main__":
    main(sys.argv[1])
