"""submit's verl config check keeps its answers: the same verl, config files, model config and overrides give the
same answer without importing verl's trainer again (~30 s on a GPU machine); any of them changed asks verl again,
and an answer that depended on something missing (skipped) is never kept. Run on a stand-in verl package that
counts its imports, with the real probe, Hydra and OmegaConf."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from verl_cluster.submit.verl_config import MARK, PROBE, from_probe

pytest.importorskip("hydra")

MAIN = '''import hydra


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config):
    pass


def need_critic(cfg):
    return False


def need_reference_policy(cfg):
    return False
'''
VALIDATE = '''def validate_config(config, use_reference_policy, use_critic):
    if config.trainer.n_gpus_per_node == 3:
        raise FileNotFoundError("no config.json at /models/x")
    if config.data.train_batch_size % 2:
        raise ValueError("train_batch_size must be even")
'''
CONFIG = "data:\n  train_batch_size: 8\ntrainer:\n  n_gpus_per_node: 8\n"


@pytest.fixture
def verl(tmp_path):
    """A verl package whose import is counted in imports.log, and a home of the test's own."""
    pkg = tmp_path / "site" / "verl"
    (pkg / "trainer" / "config").mkdir(parents=True)
    (pkg / "utils").mkdir()
    (pkg / "__init__.py").write_text("import os\nopen(os.environ['VC_TEST_IMPORTS'], 'a').write('imported\\n')\n")
    (pkg / "trainer" / "__init__.py").write_text("")
    (pkg / "trainer" / "main_ppo.py").write_text(MAIN)
    (pkg / "trainer" / "config" / "ppo_trainer.yaml").write_text(CONFIG)
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "config.py").write_text(VALIDATE)
    return tmp_path


def probe(root: Path, overrides, **env):
    req = {"module": "verl.trainer.main_ppo", "overrides": overrides}
    full = {**os.environ, "PYTHONPATH": str(root / "site"), "HOME": str(root / "home"),
            "VC_TEST_IMPORTS": str(root / "imports.log"), "HF_HUB_OFFLINE": "1", **env}
    p = subprocess.run([sys.executable, str(PROBE), json.dumps(req)], capture_output=True, text=True, timeout=120,
                       env=full)
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith(MARK)), None)
    assert line, p.stderr[-2000:]
    return json.loads(line[len(MARK):])


def imports(root: Path) -> int:
    log = root / "imports.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_the_same_question_is_answered_from_the_cache(verl):
    first = probe(verl, ["data.train_batch_size=4"])
    assert first["validated"] and not first.get("cached") and imports(verl) == 1
    again = probe(verl, ["data.train_batch_size=4"])
    assert again["validated"] and again["cached"] and imports(verl) == 1  # verl not imported the second time
    check = from_probe(again)
    assert check.ran and check.validated and check.cached == again["cached"]
    folder = verl / "home" / ".verl-cluster" / "cache" / "verl-probe"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and len(list(folder.glob("*.json"))) == 1


def test_verls_rejection_is_kept_too_and_a_changed_override_asks_again(verl):
    bad = probe(verl, ["data.train_batch_size=3"])
    assert "must be even" in bad["error"] and imports(verl) == 1
    assert probe(verl, ["data.train_batch_size=3"])["cached"] and imports(verl) == 1
    assert probe(verl, ["data.train_batch_size=6"])["validated"] and imports(verl) == 2


def test_a_changed_config_file_asks_verl_again(verl):
    assert probe(verl, ["data.train_batch_size=4"])["validated"] and imports(verl) == 1
    (verl / "site/verl/trainer/config/ppo_trainer.yaml").write_text(CONFIG + "extra: 1\n")
    again = probe(verl, ["data.train_batch_size=4"])
    assert again["validated"] and not again.get("cached") and imports(verl) == 2


def test_an_edited_verl_asks_again(verl):
    """Any file of verl's package counts (an editable install edited: validate_config's own code here)."""
    assert probe(verl, ["data.train_batch_size=4"])["validated"] and imports(verl) == 1
    assert probe(verl, ["data.train_batch_size=4"])["cached"] and imports(verl) == 1
    # a new size as well as a new time: Python's own .pyc check reads the time in whole seconds, and this edit
    # comes within the second of the first import
    (verl / "site/verl/utils/config.py").write_text(VALIDATE.replace("% 2", "% 8").replace("even", "a multiple of 8"))
    again = probe(verl, ["data.train_batch_size=4"])
    assert "must be a multiple of 8" in again["error"] and not again.get("cached") and imports(verl) == 2


def test_unknown_keys_are_found_without_verl_and_kept(verl):
    got = probe(verl, ["data.train_batch_sise=4"])
    assert got["unknown"] == [["data.train_batch_sise", "data.train_batch_size"]] and imports(verl) == 0
    assert probe(verl, ["data.train_batch_sise=4"])["cached"]


def test_a_skipped_answer_is_never_kept(verl):
    """validate_config could not read a model file: asked again next time (the file may be there by then)."""
    for n in (1, 2):
        got = probe(verl, ["trainer.n_gpus_per_node=3"])
        assert got["skipped"].startswith("verl's validation needs local model files") and not got.get("cached")
        assert imports(verl) == n


def test_the_cache_can_be_turned_off(verl):
    for n in (1, 2):
        got = probe(verl, ["data.train_batch_size=4"], VC_VERL_PROBE_CACHE="0")
        assert got["validated"] and not got.get("cached") and imports(verl) == n
    assert not (verl / "home" / ".verl-cluster").exists()


def test_a_models_config_is_part_of_the_question(verl):
    model = verl / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    words = ["data.train_batch_size=4", f"+actor_rollout_ref.model.path={model}"]
    assert probe(verl, words)["validated"] and imports(verl) == 1
    assert probe(verl, words)["cached"] and imports(verl) == 1
    (model / "config.json").write_text('{"hidden_size": 8}')
    assert not probe(verl, words).get("cached") and imports(verl) == 2
