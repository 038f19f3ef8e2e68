"""`import SCRIPT`: a verl example script (or `-- python3 -m verl...`) as a job spec, YAML on stdout.

    verl-cluster import run_qwen2-7b_grpo.sh > job.yaml

model/data go to the spec's own fields, every other key=value under `overrides`, exported variables under
`env` (secret-looking ones under `secrets`, values never written), each with a `# script:line` comment.
"""

from __future__ import annotations

import argparse
import sys

from verl_cluster.cli.output import print_json
from verl_cluster.errors import EXIT_OK, ConfigError
from verl_cluster.verl_scripts.script_import import is_python, load_job_input


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("import", parents=[common], help="turn a verl script into a job spec (YAML on stdout)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", help="a verl script (run_qwen2-7b_grpo.sh), or -- python3 -m verl.trainer.main_ppo ...")
    p.add_argument("words", nargs="*", metavar="ARG", help="after --: the rest of the python command")
    p.add_argument("--json", action="store_true", help="the spec as JSON, with the script line of each value")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    words = list(args.words) + list(getattr(args, "overrides", None) or [])
    first = args.script
    if words and not is_python(first):
        raise ConfigError(f"import {first}: unexpected {' '.join(words)}",
                          "import writes the script as it is; add key=value when you plan or submit the spec")
    job, imp = load_job_input(first, words)  # builds the JobSpec: what submit would refuse is refused here
    if imp is None:
        raise ConfigError(f"{first}: already a job spec", "import takes a bash script (.sh) or -- python3 -m ...")
    if args.json:
        print_json({"spec": imp.data, "origins": {".".join(k): v for k, v in imp.origins.items()},
                    "from_shell": imp.from_shell, "notes": imp.notes, "takes_args": imp.takes_args})
    else:
        sys.stdout.write(imp.to_yaml())
    return EXIT_OK
