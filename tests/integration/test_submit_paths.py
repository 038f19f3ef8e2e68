"""`submit launch/gsm8k.yaml` with its `~/data/gsm8k/*.parquet` paths, on the session's shared cluster (real sshd,
real Ray; each namespace host has its own private home at the same path, /root).

- The request carries the absolute paths every node expands `~` to, and verl's own dataset loader reads them on a
  worker host: verl 0.9.1's config composed by Hydra from the request's override words, its tokenizer loaded from
  the model path the request carries (verl.utils.fs.copy_to_local, verl.utils.hf_tokenizer), then
  verl.trainer.ppo.utils.create_rl_dataset on config.data.train_files and val_files (RLHFDataset: copy_to_local,
  then datasets.load_dataset("parquet", data_files=...)): what the TaskRunner does at start. The suite's venv has
  verl 0.9.1 (.ci/requirements-test.txt), so this is what runs; in a venv without verl the test makes verl's own
  call on each path instead, datasets.load_dataset("parquet", data_files=PATH)["train"] (pyarrow's reader
  without `datasets`), and says which in its assertion message.
- A node whose login has another HOME (sshd's SetEnv) expands `~` elsewhere: preflight refuses the job, naming
  both nodes and both paths, and the request keeps the path as written.
"""

import importlib.util
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.harness.cli import run_cli
from verl_cluster.config.cluster import load_cluster
from verl_cluster.verl_scripts.hydra_values import from_hydra
from verl_cluster.testdata.tiny_model import model_config

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures/prompts"
HOME = "/root"  # every host's home folder, private to it (tests/harness/netns.py)

# run inside a host: verl's config from the request's words, then verl's loader on the paths it names
LOAD_AS_VERL_DOES = r"""
import json, os, sys
from hydra import compose, initialize_config_dir
import verl
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import hf_tokenizer
from verl.utils.fs import copy_to_local

words = json.loads(sys.argv[1])
with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer/config"),
                           version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=words)
tokenizer = hf_tokenizer(copy_to_local(cfg.actor_rollout_ref.model.path))
rows = {}
for key in ("train_files", "val_files"):
    try:
        rows[key] = len(create_rl_dataset(cfg.data[key], cfg.data, tokenizer, None))
    except Exception as e:
        rows[key] = f"{type(e).__name__}: {e}"
print("ROWS " + json.dumps({"how": "verl " + verl.__version__, "rows": rows}))
"""

# without verl: the call RLHFDataset._read_files_and_tokenize makes on each (local) path
LOAD_AS_VERL_CALLS = r"""
import json, sys
files = json.loads(sys.argv[1])
rows = {}
for key, paths in files.items():
    try:
        import datasets
        how = "datasets.load_dataset"
        rows[key] = sum(len(datasets.load_dataset("parquet", data_files=p)["train"]) for p in paths)
    except ImportError:
        import pyarrow.parquet as pq
        how = "pyarrow.parquet"
        rows[key] = sum(pq.read_table(p).num_rows for p in paths)
    except Exception as e:
        rows[key] = f"{type(e).__name__}: {e}"
print("ROWS " + json.dumps({"how": how, "rows": rows}))
"""


def _give_home(host, sub=""):
    """~/data/gsm8k/{train,test}.parquet and ~/model (tokenizer + a tiny config) in the host's own home."""
    home = host.home / "home" / sub
    (home / "data/gsm8k").mkdir(parents=True, exist_ok=True)
    for name in ("train", "test"):
        shutil.copy(FIX / "gsm8k_train.parquet", home / f"data/gsm8k/{name}.parquet")
    shutil.copytree(FIX / "tokenizer", home / "model", dirs_exist_ok=True)
    (home / "model/config.json").write_text(json.dumps(model_config("tiny", 3000, 0, 2)))


def _dry_run(cluster_file, tmp_path):
    r = run_cli("submit", ROOT / "launch/gsm8k.yaml", "model.path=~/model", "trainer.n_gpus_per_node=1",
                "--dry-run", "--json", "-c", cluster_file, env={"HOME": str(tmp_path)})
    try:
        return r, json.loads(r.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (rc {r.returncode}): {r.stdout[-2000:]} {r.stderr[-3000:]}")


def _words(doc):
    """The verl override words of the request's entrypoint (after `-m verl.trainer.main_ppo`)."""
    argv = shlex.split(doc["request"]["entrypoint"])
    return argv[argv.index("verl.trainer.main_ppo") + 1:]


def _value(words, key):
    return from_hydra(next(w.split("=", 1)[1] for w in words if w.split("=", 1)[0] == key))


def test_the_request_carries_absolute_paths_that_verls_loader_reads_on_a_worker(shared_cluster, tmp_path):
    head, worker = shared_cluster.head, shared_cluster.worker
    for host in (head, worker):
        _give_home(host)
    r, doc = _dry_run(shared_cluster.path, tmp_path)
    words = _words(doc)
    assert _value(words, "data.train_files") == [f"{HOME}/data/gsm8k/train.parquet"], words
    assert _value(words, "data.val_files") == [f"{HOME}/data/gsm8k/test.parquet"]
    assert _value(words, "actor_rollout_ref.model.path") == f"{HOME}/model"
    assert _value(words, "critic.model.path") == f"{HOME}/model"
    assert not [w for w in words if "~" in w], words
    found = {(f["level"], f["check"]): f["message"] for f in doc["preflight"]}
    assert found[("ok", "data")] == "2 data file(s) on every node; columns match verl's schema"
    assert "~/data/gsm8k/train.parquet -> /root/data/gsm8k/train.parquet" in found[("ok", "paths")]
    assert not [f for f in doc["preflight"] if f["check"] in ("data", "model", "paths") and f["level"] == "error"]

    if importlib.util.find_spec("verl") is not None:  # the hosts run this Python
        argv = [sys.executable, "-c", LOAD_AS_VERL_DOES, json.dumps(words)]
    else:
        files = {k: _value(words, f"data.{k}") for k in ("train_files", "val_files")}
        argv = [sys.executable, "-c", LOAD_AS_VERL_CALLS, json.dumps(files)]
    ran = worker.run(argv, timeout=240, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    line = next((x for x in ran.stdout.splitlines() if x.startswith("ROWS ")), None)
    assert line, ran.stderr[-3000:]
    got = json.loads(line[5:])
    assert got["rows"] == {"train_files": 2000, "val_files": 2000}, f"read by {got['how']}: {got['rows']}"
    if got["how"].startswith("verl"):
        assert got["how"] == "verl 0.9.1"


def test_a_node_with_another_home_is_refused_naming_both_nodes_and_paths(shared_cluster, tmp_path):
    """A third host whose SSH login has HOME=/root/elsewhere (its own copy of the files there) joins the shared
    head and worker in a cluster file of its own; the shared cluster itself is left as it was."""
    lab, head, worker = shared_cluster.lab, shared_cluster.head, shared_cluster.worker
    for host in (head, worker):
        _give_home(host)
    other = lab.add_host("otherhome")
    lab.stop(other)
    with open(other.home / "sshd_config", "a") as f:
        f.write("SetEnv HOME=/root/elsewhere\n")
    lab.start(other)
    _give_home(other, "elsewhere")
    name = load_cluster(shared_cluster.path).cluster_name
    cluster_file = lab.cluster_yaml(head, [worker, other], name=name, extra="network:\n  interface: eth0\n",
                                    path=tmp_path / "three.yaml")
    try:
        r, doc = _dry_run(cluster_file, tmp_path)
    finally:
        lab.stop(other)
    assert r.returncode != 0
    errors = [f["message"] for f in doc["preflight"] if f["level"] == "error" and f["check"] == "data"]
    assert (f"data.train_files: `~/data/gsm8k/train.parquet` is a different path on each node "
            f"({HOME}/data/gsm8k/train.parquet on {head.ip}, {worker.ip}; "
            f"{HOME}/elsewhere/data/gsm8k/train.parquet on {other.ip}): verl would read another file on each") in errors
    model = [f["message"] for f in doc["preflight"] if f["level"] == "error" and f["check"] == "model"]
    assert any(m.startswith("actor_rollout_ref.model.path: `~/model` is a different path on each node") for m in model)
    assert _value(_words(doc), "data.train_files") == ["~/data/gsm8k/train.parquet"]  # nothing rewritten


def test_after_a_run_that_saves_checkpoints_submit_prints_the_line_that_resumes_it(shared_cluster, tmp_path):
    """A real Ray job on the shared cluster whose words carry verl's checkpoint settings (the program ignores
    them); when it ends, submit prints the exact resume line, which the CLI parses back into the same job."""
    job = tmp_path / "ck.yaml"
    job.write_text("name: ck\nlauncher: ray\ncommand: [python, -c, \"print('one step')\"]\n"
                   "overrides:\n  trainer:\n    save_freq: 2\n    default_local_dir: /var/tmp/ck-run\n")
    r = run_cli("submit", job, "-c", shared_cluster.path, env={"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    text = " ".join(r.stderr.split())
    line = f"verl-cluster submit {job} trainer.resume_mode=auto -c {Path(shared_cluster.path).resolve()}"
    assert f"resume it by hand from its newest checkpoint in /var/tmp/ck-run: {line}" in text, r.stderr[-2000:]
    assert text.index("SUCCEEDED") < text.index("resume it by hand")
