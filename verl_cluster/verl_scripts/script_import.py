"""What users already have -> a job spec: a verl example script, or a `python3 -m verl...` command line.

`import_script` / `import_argv` build the same data a job YAML holds (model/data lifted out, every other
key=value under `overrides`, exported variables under `env`, secret-looking ones under `secrets`), so
`submit run.sh` and `submit $(import run.sh > job.yaml)` run the same job. `to_yaml` writes it with a comment
per value naming the script line it came from; secret values are never written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from verl_cluster.config.job import JobSpec, is_verl_trainer, job_from_data, load_job, takes_hydra_overrides
from verl_cluster.config.names import MASK, has_url_credentials, mask_url_credentials
from verl_cluster.config.loader import read_text_bounded, short
from verl_cluster.errors import ConfigError
from verl_cluster.verl_scripts.hydra_values import from_hydra
from verl_cluster.verl_scripts.shell_words import ARGS, PYTHON, Field, looks_secret, read_script

SCRIPT_SUFFIXES = (".sh", ".bash")
HYDRA_FLAGS = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd")
KEY = re.compile(r"(\+{1,2})?[A-Za-z_][\w\-/@]*(\.[\w\-/@]+)*")
MODEL_KEY = "actor_rollout_ref.model.path"
@dataclass
class ImportedJob:
    """The job spec's data (as YAML would hold it) and where each value came from."""
    data: dict[str, Any]
    source: str
    origins: dict[tuple, int] = field(default_factory=dict)  # ("overrides", key) / ("model", "path") ... -> line
    secret_values: dict[str, str] = field(default_factory=dict)  # set by the script itself; never printed
    from_shell: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    takes_args: bool = False
    derived: dict[str, str] = field(default_factory=dict)  # variables whose value came from a secret -> that secret

    def hidden(self, name: str, value: str = "") -> bool:
        """A variable whose value is never printed: a secret, or one holding or made from one."""
        return looks_secret(name) or name in self.derived or name in self.secret_values or has_url_credentials(value)

    def job(self, cli_overrides: Optional[list[str]] = None) -> JobSpec:
        return job_from_data(self.data, self.source, cli_overrides, self.origins)

    def to_yaml(self) -> str:
        return render_yaml(self)


def _name(source: str, module: str, overrides: Mapping[str, Any]) -> str:
    if source.endswith(SCRIPT_SUFFIXES):
        stem = Path(source).stem
    else:
        stem = str(overrides.get("trainer.experiment_name") or module.rsplit(".", 1)[-1])
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-") or "job"


def _program(argv: list[Field], src: str) -> tuple[str, int, int]:
    """(module, line, index of its first argument) of `python [-u] -m MODULE ...`; module "" for
    `python [-u] SCRIPT.py ...`, whose arguments start after the script."""
    line = argv[0].line
    words = [f.text for f in argv]
    j = 1
    while j < len(words) and words[j] in ("-u", "-B", "-O", "-OO", "-E", "-s", "-I"):
        j += 1
    if j + 1 < len(words) and words[j] == "-m":
        return words[j + 1], line, j + 2
    if j < len(words) and words[j].endswith(".py"):
        return "", line, j + 1
    raise ConfigError(f"{src}:{line}: only `python -m MODULE ...` and `python SCRIPT.py ...` lines are understood, "
                      f"not `{' '.join(words[:3])} ...`", "run verl as a module: python3 -m verl.trainer.main_ppo ...")


def build_import(argv: list[Field], src: str, env: Optional[Mapping[str, tuple[str, int]]] = None,
                 secrets: Optional[Mapping[str, Optional[str]]] = None,
                 derived: Optional[Mapping[str, str]] = None) -> ImportedJob:
    """The job spec data for one `python -m MODULE args...` (fields carry their script lines). `derived`: the
    variables whose value came from a secret: in `env` they are secrets themselves."""
    env, secrets, derived = env or {}, secrets or {}, derived or {}

    def secret(k: str, v: str) -> bool:
        return looks_secret(k) or k in derived or has_url_credentials(v)
    module, line, at = _program(argv, src)
    rest = argv[at:]
    # verl's Hydra programs take overrides (its argparse tools do not); so does another program whose words are all key=value (a Hydra app, the
    # product's stand-in job): they are read as overrides, which submit and watch read (checkpoint folder, world).
    # Any other program's words (argparse flags, positionals) are its own, passed as given.
    hydra = takes_hydra_overrides(module) or all(
        f.text == ARGS or (f.text.partition("=")[1] and KEY.fullmatch(f.text.partition("=")[0])) for f in rest)
    args: list[str] = []
    overrides: dict[str, Any] = {}
    origins: dict[tuple, int] = {("entrypoint" if module else "command",): line}
    takes_args = False
    i = 0
    while i < len(rest):
        f = rest[i]
        i += 1
        if f.text == ARGS:
            takes_args = True
            continue
        if not hydra:
            args.append(f.text)
            origins.setdefault(("args",), f.line)
            continue
        flag = next((h for h in HYDRA_FLAGS if f.text == h or f.text.startswith(h + "=")), None)
        if flag:
            if f.text == flag:
                if i >= len(rest):
                    raise ConfigError(f"{src}:{f.line}: `{flag}` without a value")
                f = Field(f"{flag}={rest[i].text}", f.line)
                i += 1
            args.append(f.text)
            origins.setdefault(("args",), f.line)
            continue
        key, eq, raw = f.text.partition("=")
        if f.text.startswith("~"):
            raise ConfigError(f"{src}:{f.line}: `{f.text}` deletes a verl key; a job spec cannot say that",
                              "remove it (or set the key to null)")
        if not eq or not KEY.fullmatch(key):
            raise ConfigError(f"{src}:{f.line}: `{f.text}` is not a key=value override",
                              "verl takes Hydra overrides such as data.train_batch_size=256")
        overrides.pop(key, None)  # Hydra: the later value wins; keep the order of the last one
        overrides[key] = from_hydra(raw)
        origins[("overrides", key)] = f.line
    # interpreter flags (-u) are dropped as for a module: torchrun takes the script, not python's flags
    program = {"entrypoint": module} if module else {"command": [argv[0].text, argv[at - 1].text]}
    data: dict[str, Any] = {"name": _name(src, module or Path(argv[at - 1].text).stem, overrides), **program,
                            "launcher": "ray" if is_verl_trainer(module) else "auto"}
    if args:
        data["args"] = args
    model = overrides.pop(MODEL_KEY, None)
    if model is not None:
        data["model"] = {"path": str(model)}
        origins[("model", "path")] = origins.pop(("overrides", MODEL_KEY))
        if str(overrides.get("critic.model.path")) == str(model):  # the spec's model.path sets it too
            overrides.pop("critic.model.path")
            origins.pop(("overrides", "critic.model.path"))
    files = {}
    for which in ("train_files", "val_files"):
        key = f"data.{which}"
        if key in overrides:
            v = overrides.pop(key)
            files[which] = [str(x) for x in v] if isinstance(v, list) else [str(v)]
            origins[("data", which)] = origins.pop(("overrides", key))
    if files:
        data["data"] = files
    env_out = {k: v for k, (v, _) in env.items() if not secret(k, v)}
    for k, (_, ln) in env.items():
        origins[("env", k)] = ln
    secret_names = list(dict.fromkeys([k for k, (v, _) in env.items() if secret(k, v)] + list(secrets)))
    if env_out:
        data["env"] = env_out
    if secret_names:
        data["secrets"] = secret_names
    if overrides:
        data["overrides"] = overrides
    known = {k: v for k, (v, _) in env.items() if secret(k, v)}
    known.update({k: v for k, v in dict(secrets).items() if v is not None})
    return ImportedJob(data, src, origins, known, takes_args=takes_args, derived=dict(derived))


def import_script(path: str | os.PathLike, environ: Optional[Mapping[str, str]] = None) -> ImportedJob:
    src = short(path)
    text = read_text_bounded(path, "script")
    run = read_script(text, src, environ)
    env = {**run.exported, **run.program.prefix_env}
    imp = build_import(run.program.argv, src, env, run.secrets, run.derived)
    imp.from_shell, imp.notes = run.from_shell, run.notes
    return imp


def import_argv(argv: list[str]) -> ImportedJob:
    """`submit -- python3 -m verl.trainer.main_ppo key=value ...`: the words as the shell already split them."""
    return build_import([Field(a, 0) for a in argv], "<command line>")


def is_script(path: str) -> bool:
    if path.endswith(SCRIPT_SUFFIXES):
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def is_python(word: str) -> bool:
    return bool(PYTHON.fullmatch(word))


def load_job_input(first: str, rest: list[str], before: list[str] = ()) -> tuple[JobSpec, Optional[ImportedJob]]:
    """The job a command names: `JOB.yaml key=value...`, `SCRIPT.sh key=value...` or `-- python3 -m MODULE ...`
    (then every word after the module is the program's; `before`: the job's key=value words given before `--`,
    applied first in every form). The ImportedJob is None for a YAML spec."""
    if is_python(first):
        imp = import_argv([first] + list(rest))
        return imp.job(list(before)), imp
    if is_script(first):
        if not Path(first).is_file():
            raise ConfigError(f"{first}: script not found")
        imp = import_script(first)
        return imp.job(list(before) + list(rest)), imp
    return load_job(first, list(before) + list(rest)), None


def script_key_origin(source: str, key: str) -> Optional[str]:
    """'run.sh:12' for a verl key an imported script sets, else None."""
    try:
        imp = import_script(source)
    except ConfigError:
        return None
    bare = key.lstrip("+")
    lifted = {MODEL_KEY: ("model", "path"), "data.train_files": ("data", "train_files"),
              "data.val_files": ("data", "val_files")}
    for path in (lifted.get(bare), ("overrides", key), ("overrides", bare), ("overrides", "+" + bare),
                 ("overrides", "++" + bare)):
        if path in imp.origins:
            return f"{source}:{imp.origins[path]}"
    return None


def _dump(v: Any) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text[:-3].strip() if text.endswith("\n...") or text.endswith("...") else text


def _shown(value: str, imp: ImportedJob) -> str:
    for v in imp.secret_values.values():
        if v:
            value = value.replace(v, MASK)
    return mask_url_credentials(value)


def render_yaml(imp: ImportedJob) -> str:
    """The job spec as YAML, a `# file:line` comment on each value; secret values are not in it."""
    where = Path(imp.source).name

    def tail(path: tuple) -> str:
        line = imp.origins.get(path)
        return f"  # {where}:{line}" if line else ""

    d = imp.data
    out = [f"# job spec imported from {imp.source} by `verl-cluster import`",
           "# submit it: verl-cluster submit THIS.yaml (plan it: verl-cluster plan THIS.yaml --gpus 1x8xH100-80GB)"]
    out += [f"# ${n} was taken from this shell's environment (first used on line {ln})"
            + ("" if imp.hidden(n, os.environ.get(n, "")) else f": {_shown(os.environ.get(n, ''), imp)}")
            for n, ln in imp.from_shell.items()]
    out += [f"# note: {n}" for n in imp.notes]
    for key in ("name", "entrypoint", "command", "launcher"):
        if key in d:
            out.append(f"{key}: {_dump(d[key])}{tail((key,))}")
    if "args" in d:
        what = "Hydra's own flags" if takes_hydra_overrides(d.get("entrypoint")) else "the program's own, passed as given"
        out.append(f"args: {_dump(d['args'])}{tail(('args',))}" + (f" ({what})" if tail(("args",)) else f"  # {what}"))
    for section in ("model", "data", "env"):
        if section in d:
            out.append(f"{section}:")
            out += [f"  {_dump(k)}: {_dump(v)}{tail((section, k))}" for k, v in d[section].items()]
    if "secrets" in d:
        out.append("secrets:  # read from the shell that runs submit: export them there (values not written here)")
        out += [f"  - {_dump(n)}{tail(('env', n))}" for n in d["secrets"]]
    if "overrides" in d:
        out.append("overrides:")
        out += [f"  {_dump(k)}: {_dump(v)}{tail(('overrides', k))}" for k, v in d["overrides"].items()]
    if imp.takes_args:
        out.append('# the script\'s "$@": key=value after the file name on the command line go there (and win)')
    return "\n".join(out) + "\n"
