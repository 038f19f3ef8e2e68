#!/usr/bin/env python3
"""Turn one of verl's example run scripts into a job spec for `plan` (tests/fixtures/verl_recipes/*.yaml).

    python scripts/verl_recipe_to_spec.py GITDIR COMMIT examples/grpo_trainer/run_qwen2-7b.sh \
        --catalog qwen2.5-7b --gpu H100-80GB > tests/fixtures/verl_recipes/grpo_qwen2_7b.yaml

Reads the script at COMMIT from a verl git directory, keeps its `key=value` arguments to verl.trainer.main_ppo
(shell variables set in the script are expanded), and writes the job with the hardware the script states
(trainer.nnodes x trainer.n_gpus_per_node of --gpu) and the source in a comment. Paths, loggers and names
are dropped: the plan does not read them.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys

import yaml

DROP = re.compile(r"^(data\.(train|val)_files|trainer\.(logger|project_name|experiment_name|default_local_dir)"
                  r"|.*\.model\.path|.*model_path)$")


def scalar(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse(script: str) -> tuple[dict, str]:
    env, args, model = {}, {}, ""
    joined = script.replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.strip()
        m = re.match(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S+)$", line)
        if m and "main_ppo" not in line:
            env[m[1]] = _expand(m[2].strip("\"'"), env)
            continue
        if "verl.trainer.main_ppo" not in line:
            continue
        for tok in shlex.split(line.split("verl.trainer.main_ppo", 1)[1], comments=True):
            if "=" not in tok or tok.startswith("$"):
                continue
            key, value = tok.split("=", 1)
            value = _expand(value, env)
            if key.endswith("actor_rollout_ref.model.path"):
                model = value
            if not DROP.match(key.lstrip("+")):
                args[key] = scalar(value)
    return args, model


def _expand(text: str, env: dict) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m[1], m[0]), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gitdir")
    ap.add_argument("commit")
    ap.add_argument("path")
    ap.add_argument("--catalog", required=True, help="model catalog key with the same shape as the script's model")
    ap.add_argument("--gpu", default="H100-80GB", help="GPU catalog key (the script's hardware)")
    ap.add_argument("--note", default="", help="one line on what the source says about the hardware")
    a = ap.parse_args()
    text = subprocess.run(["git", "--git-dir", a.gitdir, "show", f"{a.commit}:{a.path}"], check=True,
                          capture_output=True, text=True).stdout
    args, model = parse(text)
    nn, g = args.get("trainer.nnodes", 1), args.get("trainer.n_gpus_per_node", 8)
    spec = {"name": a.path.rsplit("/", 1)[-1].removesuffix(".sh").replace("_", "-").replace(".", "-").lower(),
            "entrypoint": "verl.trainer.main_ppo", "launcher": "ray",
            "model": {"path": model, "catalog": a.catalog}, "placement": {"gpus": f"{nn}x{g}x{a.gpu}"},
            "overrides": args}
    sys.stdout.write(f"# verl recipe: volcengine/verl {a.path} @ {a.commit}\n"
                     f"# model {model} planned as catalog {a.catalog} (same shape); hardware {nn}x{g}x{a.gpu}"
                     f"{': ' + a.note if a.note else ''}\n")
    sys.stdout.write(yaml.safe_dump(spec, sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
