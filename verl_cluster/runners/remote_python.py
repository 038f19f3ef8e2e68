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


PYTHON_HINT = ("set ray.ray_executable (or the node's ray_executable) to the absolute path of `ray` in the node's "
               "environment (`command -v ray` there): its Python is the `python` beside it")


class PythonNotFound(RunnerError):
    """The node answered, but the Python beside its configured `ray` is not there: a setting, not the network."""


def missing_python(host: str, python: str, why: str = "not found") -> PythonNotFound:
    return PythonNotFound(host, f"`{python}` {why} on {host}: the Python beside the configured `ray` "
                                "(ray.ray_executable)", PYTHON_HINT)


def run_python(runner: CommandRunner, python: str, source: str, args: Sequence[str] = (), *,
               env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Any:
    """Run `source` with `python` on the node; return the JSON it printed after MARK."""
    try:
        res = runner.run([python, "-c", source, *args], env=env, timeout=timeout)
    except RunnerError as e:  # this machine's runner could not start it at all
        if type(e) is RunnerError and e.reason.startswith(f"`{python}` "):
            raise missing_python(runner.host, python, e.reason[len(python) + 3:]) from None
        raise
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    if res.rc in (126, 127) or "No such file" in res.stderr and python in res.stderr:
        raise missing_python(runner.host, python, "not found" if res.rc != 126 else "cannot be run")
    raise RunnerError(runner.host, f"node script failed (rc={res.rc}): {res.tail(5) or 'no output'}")


def emit(data: Any) -> None:
    """For node-side scripts: print the JSON result line."""
    print(MARK + json.dumps(data, default=str), flush=True)
