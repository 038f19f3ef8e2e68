"""Node-side probe (stdlib, plus pyarrow when the node has it): data files and model dirs as JSON.

Run as `python -c SOURCE '{"data": [...], "model": "...", "expand": [...], "env": {...}}'`; prints one MARK line
(see runners.remote_python). Also imported locally for `type_tree` and `expand`.

Paths are expanded as the job's processes on this node will see them: `~` and `$VAR` (not OmegaConf's `${...}`) with the node's login
environment plus `env` (the cluster's Ray env, the node's env and the job's env: what the Ray daemons and the job
start with). verl opens paths as written, so submit sends it the expansion, once every node agrees on it.
"""

import json
import os
import re
import sys

MARK = "@@VC-JSON@@"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def type_tree(t):
    import pyarrow.types as pt

    if pt.is_string(t) or pt.is_large_string(t):
        return {"kind": "string"}
    if pt.is_integer(t):
        return {"kind": "int"}
    if pt.is_floating(t):
        return {"kind": "float"}
    if pt.is_boolean(t):
        return {"kind": "bool"}
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return {"kind": "list", "item": type_tree(t.value_type)}
    if pt.is_struct(t):
        return {"kind": "struct", "fields": {t.field(i).name: type_tree(t.field(i).type) for i in range(t.num_fields)}}
    return {"kind": "other"}


# `$VAR` only: `${...}` in a verl value is OmegaConf's interpolation (`${oc.env:DATA}`), which verl resolves itself
_VAR = re.compile(r"\$(\w+)")


def expand(path):
    """`~` then `$VAR`, as a shell would on this node (an unset variable stays as written)."""
    return _VAR.sub(lambda m: os.environ.get(m.group(1), m.group(0)), os.path.expanduser(path))


def expansion(path):
    """{"path": the expansion, "unset": variables still unexpanded in it}."""
    p = expand(path)
    return {"path": p, "unset": [m.group(1) for m in _VAR.finditer(p)]}


def probe_data(path):
    p = expand(path)
    if not os.path.exists(p):
        return {"path": path, "resolved": p, "exists": False}
    out = {"path": path, "resolved": p, "exists": True, "size": os.path.getsize(p)}
    if os.path.isdir(p):
        out["error"] = "is a directory"
        return out
    if out["size"] < 8:  # a parquet file is at least its two 4-byte PAR1 marks (seeking 4 back: EINVAL)
        out["error"] = "empty file (0 bytes)" if not out["size"] else f"not a parquet file ({out['size']} bytes)"
        return out
    try:
        with open(p, "rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            tail = f.read(4)
    except OSError as e:
        out["error"] = str(e)
        return out
    out["parquet"] = head == b"PAR1" and tail == b"PAR1"
    if not out["parquet"]:
        return out
    try:
        import pyarrow.parquet as pq
    except ImportError:
        out["schema_error"] = "pyarrow not installed on the node"
        return out
    try:
        schema = pq.read_schema(p)
        out["schema"] = {f.name: type_tree(f.type) for f in schema}
        out["rows"] = pq.ParquetFile(p).metadata.num_rows
    except Exception as e:  # a broken footer is a finding, not a crash
        out["schema_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def probe_model(path):
    p = expand(path)
    if os.path.isdir(p):
        names = set(os.listdir(p))
        return {"path": path, "kind": "dir", "config": "config.json" in names,
                "tokenizer": [n for n in TOKENIZER_FILES if n in names]}
    if os.path.exists(p):
        return {"path": path, "kind": "file"}
    if p.startswith(("/", "~", ".", "$")) or p.count("/") != 1:
        return {"path": path, "kind": "missing"}
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    cached = os.path.isdir(os.path.join(hub, "models--" + path.replace("/", "--")))
    return {"path": path, "kind": "hub", "cached": cached, "offline": os.environ.get("HF_HUB_OFFLINE") == "1"}


def wandb_login():
    """Can wandb log in here without a prompt: WANDB_API_KEY set, `wandb login`'s entry in ~/.netrc, or a
    WANDB_MODE that needs no login."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return True
    try:
        with open(os.path.expanduser("~/.netrc")) as f:
            return "api.wandb.ai" in f.read()
    except OSError:
        return False


def main(arg):
    req = json.loads(arg)
    os.environ.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
    out = {"data": [probe_data(d) for d in req.get("data", [])],
           "expanded": {p: expansion(p) for p in req.get("expand", [])}}
    if req.get("model"):
        out["model"] = probe_model(req["model"])
    if req.get("wandb"):
        out["wandb_login"] = wandb_login()
    print(MARK + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
