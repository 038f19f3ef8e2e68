"""Run a stdlib-only Python script on a node (`python -c SOURCE ARGS...`) and read back JSON.

Node-side helpers (process lists, GPU facts, GCS queries) are plain modules shipped as source, so nothing
has to be installed on the nodes beyond the Python that holds Ray.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from verl_cluster.errors import RunnerError
from verl_cluster.runners.base import CommandRunner

MARK = "@@VC-JSON@@"  # the script prints MARK + json on its last line; anything before is noise


def script_source(module_file: str, *included: str) -> str:
    """A node-side script's text, after the text of the node-side modules it uses (each defines at top level what
    the script would otherwise import: the script imports them only when it is not shipped)."""
    return "".join(Path(f).read_text() + "\n" for f in included) + Path(module_file).read_text()


def run_python(runner: CommandRunner, python: str, source: str, args: Sequence[str] = (), *,
               env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Any:
    """Run `source` with `python` on the node; return the JSON it printed after MARK."""
    res = runner.run([python, "-c", source, *args], env=env, timeout=timeout)
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    if "No such file" in res.stderr or res.rc == 127:
        raise RunnerError(runner.host, f"`{python}` not found on the node",
                          "set ray.ray_executable to the absolute path of `ray` in the node's environment")
    raise RunnerError(runner.host, f"node script failed (rc={res.rc}): {res.tail(5) or 'no output'}")


def emit(data: Any) -> None:
    """For node-side scripts: print the JSON result line."""
    print(MARK + json.dumps(data, default=str), flush=True)
