"""A job that fails before its program ran a line (its module or script not where it ran, a command the shell
cannot run, Hydra refusing the command line) is classified as the run's own mistake, never retried, and the fix
says how to ship a module that is in the folder the job was submitted from. The log text is the interpreter's and
the shell's own, made here by running them; the first line is the one Ray writes before the entrypoint's output."""

import subprocess
import sys
from pathlib import Path

import pytest

from verl_cluster.verl_logs.verl_log import classify
from verl_cluster.watch.failures import diagnose

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "verl_logs"
RAY_EXIT = "Job entrypoint command failed with exit code {}, last available logs (truncated to 20,000 chars):\n"


def driver_log(argv, cwd, shell=False):
    """(the driver's log as Ray writes it: its entrypoint line, then the command's output; the exit code)."""
    cmd = " ".join(argv) if shell else argv
    r = subprocess.run(cmd, cwd=cwd, shell=shell, capture_output=True, text=True, timeout=60)
    text = " ".join(argv)
    return [f"Running entrypoint for job j-1: {text}"] + (r.stdout + r.stderr).splitlines(), r.returncode


@pytest.fixture
def node(tmp_path):
    """Where the job runs (nothing of the user's code there) and the folder it was submitted from."""
    (tmp_path / "node").mkdir()
    (tmp_path / "here").mkdir()
    return tmp_path / "node", tmp_path / "here"


def not_retried(d, detail):
    assert d.cls == "user-code" and not d.retry and d.detail == detail, d
    return d


def test_module_not_found_names_the_command_that_ships_it(node):
    where, here = node
    (here / "mymod.py").write_text("print('hi')\n")
    lines, rc = driver_log([sys.executable, "-m", "mymod", "--steps", "3"], where)
    assert rc == 1 and lines[1].endswith(": No module named mymod")
    d = not_retried(diagnose(lines, RAY_EXIT.format(1) + lines[-1], made_progress=False, here=str(here)),
                    "entrypoint")
    assert d.evidence.endswith("No module named mymod")
    assert d.fix.startswith(f"mymod.py is in {here}")
    py = Path(sys.executable).name
    assert d.fix.endswith(f"verl-cluster submit --working-dir . -- {py} -m mymod ...")
    f = classify(lines, here=str(here))  # what submit's follow and `logs --follow` print
    assert f.kind == "entrypoint" and f.fix == d.fix


def test_module_that_is_nowhere_here_gets_the_generic_fix(node):
    where, here = node
    lines, _ = driver_log([sys.executable, "-m", "no_such_module"], where)
    d = not_retried(diagnose(lines, made_progress=False, here=str(here)), "entrypoint")
    assert "--working-dir DIR" in d.fix and "install it on every node" in d.fix
    assert classify(lines).fix == d.fix  # no folder to look in: the same


def test_a_package_module_and_its_package_folder(node):
    where, here = node
    (here / "mypkg").mkdir()
    (here / "mypkg" / "__init__.py").write_text("")
    (here / "mypkg" / "train.py").write_text("")
    lines, _ = driver_log([sys.executable, "-m", "mypkg.train"], where)
    assert "Error while finding module specification for 'mypkg.train'" in lines[1]
    d = not_retried(diagnose(lines, made_progress=False, here=str(here)), "entrypoint")
    assert d.fix.startswith(f"mypkg/train.py is in {here}") and d.fix.endswith("-m mypkg.train")


def test_script_not_found(node):
    where, here = node
    (here / "train.py").write_text("")
    lines, rc = driver_log([sys.executable, "-u", "train.py", "x=1"], where)
    assert rc == 2 and "can't open file" in lines[1]
    d = not_retried(diagnose(lines, made_progress=False, here=str(here)), "entrypoint")
    assert d.fix.endswith(f"--working-dir . -- {Path(sys.executable).name} train.py ...")


def test_a_package_without_main_is_not_retried(node):
    where, _ = node
    (where / "pkgonly").mkdir()
    (where / "pkgonly" / "__init__.py").write_text("")
    lines, _ = driver_log([sys.executable, "-m", "pkgonly"], where)
    d = not_retried(diagnose(lines, made_progress=False, here=str(where)), "entrypoint")
    assert "__main__.py" in d.fix and "--working-dir" not in d.fix


def test_the_entrypoints_own_import_error_is_not_retried(node):
    where, here = node
    (where / "mymod.py").write_text("import not_installed_anywhere\n")
    lines, _ = driver_log([sys.executable, "-m", "mymod"], where)
    not_retried(diagnose(lines, made_progress=False, here=str(here)), "missing-package")
    (where / "broken").mkdir()
    (where / "broken" / "__init__.py").write_text("from .nope import x\n")
    lines, _ = driver_log([sys.executable, "-m", "broken.run"], where)  # its package's __init__ fails
    assert lines[-1] == "ModuleNotFoundError: No module named 'broken.nope'"
    not_retried(diagnose(lines, made_progress=False, here=str(here)), "missing-package")


@pytest.mark.parametrize("argv", [["/opt/no/such/bin/python", "-m", "x"], ["no_such_program_zz", "--flag"]])
def test_a_command_the_shell_cannot_run_is_not_retried(node, argv):
    where, _ = node
    lines, rc = driver_log(argv, where, shell=True)  # Ray runs the entrypoint through /bin/sh
    assert rc == 127
    d = not_retried(diagnose(lines, RAY_EXIT.format(rc) + lines[-1], made_progress=False), "bad-command")
    assert argv[0] in d.evidence and "PATH" in d.fix
    # the log unread: Ray's message quotes its last lines
    not_retried(diagnose([], RAY_EXIT.format(rc) + lines[-1], made_progress=False), "bad-command")


def test_hydra_refusing_the_command_line_before_the_program_ran(node):
    """verl 0.9.1's main_ppo with an option of a config group that does not exist (recorded on this CPU; verl
    warns of a missing accelerator before Hydra composes the config)."""
    lines = ["Running entrypoint for job j-1: python -m verl.trainer.main_ppo actor@actor_rollout_ref.actor=nosuch"]
    lines += (LOGS / "cpu_verl091_hydra_group_refused.log").read_text().splitlines()
    d = not_retried(diagnose(lines, RAY_EXIT.format(1), made_progress=False), "hydra-refused")
    assert d.evidence == "In 'ppo_trainer': Could not find 'actor/nosuch'"


def test_hydra_composition_errors_made_by_hydra_here(tmp_path):
    hydra = pytest.importorskip("hydra")  # verl's dependency, in the test environment with verl
    (tmp_path / "conf" / "actor").mkdir(parents=True)
    (tmp_path / "conf" / "main.yaml").write_text("defaults:\n  - actor: dp\n  - _self_\na: 1\n")
    (tmp_path / "conf" / "actor" / "dp.yaml").write_text("x: 1\n")
    (tmp_path / "app.py").write_text(
        "import hydra\n@hydra.main(config_path='conf', config_name='main', version_base=None)\n"
        "def main(cfg):\n    print('started', cfg.a)\n    raise ValueError('the program itself')\n"
        "if __name__ == '__main__':\n    main()\n")
    assert hydra.__version__
    for word, said in (("actor=nosuch", "In 'main': Could not find 'actor/nosuch'"),
                       ("a=[1", "no viable alternative at input '[1'"),
                       ("~zz", "Could not delete from config. 'zz' does not exist.")):
        lines, rc = driver_log([sys.executable, "app.py", word], tmp_path)
        assert rc == 1
        d = not_retried(diagnose(lines, made_progress=False), "hydra-refused")
        assert d.evidence == said
    # the program ran (Hydra says 'Error executing job'): the program's own error, not Hydra's refusal
    lines, _ = driver_log([sys.executable, "app.py"], tmp_path)
    d = diagnose(lines, made_progress=False)
    assert d.detail == "user-code" and d.evidence == "ValueError: the program itself"


def test_existing_refusals_keep_their_kinds():
    lines = (LOGS / "h100_grpo_tiny_hydra_refused.log").read_text().splitlines()
    not_retried(diagnose(lines, made_progress=False), "bad-override")


def test_the_watcher_stops_at_the_first_attempt_with_the_fix(tmp_path, monkeypatch, node):
    from tests.unit.test_watch_loop import _failed, _watcher

    where, here = node
    (here / "mymod.py").write_text("print('hi')\n")
    lines, _ = driver_log([sys.executable, "-m", "mymod"], where)
    monkeypatch.chdir(here)  # the watcher of `submit --watch` runs where submit was typed
    w, st = _watcher(tmp_path, monkeypatch, [_failed("\n".join(lines))] * 2)
    assert w.run() == 1 and st.state == "failed" and st.restarts == 0 and len(st.attempts) == 1
    events = (st.dir / "events.jsonl").read_text()
    assert "not retried: the run stops" in events and "--working-dir . -- " in events


def test_the_watcher_looks_where_the_jobs_code_comes_from_not_in_its_own_folder(tmp_path, monkeypatch, node):
    """The submit's working_dir when it had one, else the folder submit ran in (run.json's submit_dir); a
    watcher started elsewhere (`watch JOB_ID`, --detach) must not find the module in its own folder."""
    from dataclasses import replace
    from types import SimpleNamespace

    from tests.unit.test_watch_loop import _watcher
    from verl_cluster.records import job_records
    from verl_cluster.watch import runs

    where, here = node
    wd, own = tmp_path / "wd", tmp_path / "watcher"
    wd.mkdir(), own.mkdir()
    lines, _ = driver_log([sys.executable, "-m", "mymod"], where)
    w, st = _watcher(tmp_path, monkeypatch, [])
    w.job = replace(w.job, working_dir=None)  # (launch/resumable.yaml ships its own folder)
    monkeypatch.chdir(own)

    def fix() -> str:
        row = SimpleNamespace(status="FAILED", message=RAY_EXIT.format(1) + lines[-1])
        out = w._ended(row, lines, None, (0.0, {}), SimpleNamespace(first_step=None))
        return not_retried(out.diagnosis, "entrypoint").fix

    (own / "mymod.py").write_text("print('hi')\n")
    assert "install it on every node" in fix()  # nothing known of the submit: the watcher's folder says nothing
    st.submit_dir = str(here)
    assert "install it on every node" in fix()  # not where submit ran either
    (here / "mymod.py").write_text("print('hi')\n")
    assert fix().startswith(f"mymod.py is in {here} ")
    (wd / "mymod.py").write_text("print('hi')\n")
    w.job = replace(w.job, working_dir=str(wd))
    assert fix().startswith(f"mymod.py is in {wd} ")
    # a run made later by `watch JOB_ID` takes the folder from the job's record
    job_records.record("j-2", st.cluster_file, st.cluster, "mymod", job_input=st.input, submit_dir=str(here))
    assert runs.find_run("j-2").submit_dir == str(here)


def test_a_tool_the_shell_missed_mid_run_is_not_the_jobs_command():
    lines = ["Running entrypoint for job j-1: python -m train", "step 1", "sh: 1: nvidia-smi: not found", "step 2",
             "step 3"]
    d = diagnose(lines, RAY_EXIT.format(137), made_progress=True)
    assert d.cls == "unknown" and d.retry
