"""The model catalog knows the dense models verl's examples use; MoE is refused by name; --model-config FILE
plans a model the catalog lacks (issue 32 item 8)."""

import json
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.errors import ConfigError
from verl_cluster.placement.model_shape import catalog, catalog_shape, resolve_shape, shape_from_hf_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests/fixtures/verl_scripts"
GSM8K = str(ROOT / "launch/gsm8k.yaml")


def test_verl_qwen2_7b_example_plans_on_8_h100(capsys):
    """verl's examples/grpo_trainer/run_qwen2-7b.sh as is: planned as Qwen2-7B, not refused as unknown."""
    rc = main(["plan", str(SCRIPTS / "run_qwen2-7b.sh"), "--gpus", "1x8xH100-80GB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1)  # a plan (fits or not as written), never bad input
    assert doc["model"]["name"] == "qwen2-7b" and doc["options"]


@pytest.mark.parametrize("hub, key", [
    ("Qwen/Qwen2-7B-Instruct", "qwen2-7b"), ("Qwen/Qwen2-72B-Instruct", "qwen2-72b"), ("Qwen/Qwen2-0.5B", "qwen2-0.5b"),
    ("Qwen/Qwen2.5-3B", "qwen2.5-3b"), ("Qwen/Qwen2.5-Math-7B", "qwen2.5-math-7b"), ("Qwen/Qwen3-8B-Base", "qwen3-8b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"), ("meta-llama/Llama-3.2-1B", "llama-3.2-1b"),
    ("deepseek-ai/deepseek-llm-7b-chat", "deepseek-llm-7b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-r1-distill-qwen-1.5b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "deepseek-r1-distill-llama-70b"),
    ("google/gemma-2-2b-it", "gemma-2-2b"), ("google/gemma-3-27b-it", "gemma-3-27b"),
    ("/models/Qwen2-7B-Instruct", "qwen2-7b"),  # a local folder without config.json: its name
])
def test_hub_names_and_variants_resolve(hub, key):
    assert resolve_shape(hub, None).name == key


def test_gemma_counts_exact():
    """Gemma 2/3 have four norms per layer (and Gemma 3 q/k norms): keras-hub's gemma3 presets state the exact
    text-only counts, with 262144 embeddings."""
    for key, count in [("gemma-3-1b", 999_885_952), ("gemma-3-12b", 11_765_788_416), ("gemma-3-27b", 27_009_002_240)]:
        s = catalog_shape(key)
        text_only = s.params - (s.vocab - 262144) * s.hidden
        assert text_only == count, key


def test_gemma_config_json_reads_like_the_catalog():
    cfg = {"model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000}
    assert shape_from_hf_config(cfg).params == catalog_shape("gemma-2-2b").params  # tied by default, 4 norms


def test_every_added_entry_cites_its_source():
    old = {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b",
           "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "llama-3.2-1b",
           "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.3-70b", "deepseek-llm-7b", "mistral-7b"}
    for key, e in catalog().items():
        assert key in old or e.get("source"), key


@pytest.mark.parametrize("name", ["Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-Instruct-v0.1",
                                  "deepseek-ai/DeepSeek-V3", "Qwen/Qwen1.5-MoE-A2.7B", "openai/gpt-oss-20b"])
def test_moe_refused_by_name(name, capsys):
    with pytest.raises(ConfigError, match="mixture-of-experts") as e:
        resolve_shape(name, None)
    assert name in e.value.message
    assert main(["plan", GSM8K, "--gpus", "1x8xH100-80GB", f"model.path={name}", "model.catalog=null"]) == 2
    assert "mixture-of-experts" in capsys.readouterr().err


def test_distill_is_not_taken_for_moe():
    assert resolve_shape("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", None).name == "deepseek-r1-distill-qwen-32b"


def test_unknown_model_offers_model_config(capsys):
    assert main(["plan", GSM8K, "--gpus", "1x8xH100-80GB", "model.path=acme/Widget-7B", "model.catalog=null"]) == 2
    err = capsys.readouterr().err
    assert "acme/Widget-7B" in err and "--model-config FILE" in err


def test_model_config_flag_plans_an_unknown_model(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 20,
                               "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 5632,
                               "vocab_size": 32000, "_name_or_path": "acme/Widget-2B"}))
    args = ["plan", GSM8K, "--gpus", "1x8xH100-80GB", "model.path=acme/Widget-2B", "model.catalog=null", "--json"]
    assert main(args + ["--model-config", str(cfg)]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["model"]["name"] == "acme/Widget-2B"


@pytest.mark.parametrize("content, why", [(None, "no such file"), ("{nope", "invalid JSON"),
                                           ('{"hidden_size": 8}', "missing"),
                                           ('{"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, '
                                            '"intermediate_size": 8, "vocab_size": 8, "num_experts": 8}',
                                            "mixture-of-experts")])
def test_bad_model_config_is_bad_input(tmp_path, capsys, content, why):
    cfg = tmp_path / "config.json"
    if content is not None:
        cfg.write_text(content)
    assert main(["plan", GSM8K, "--gpus", "1x8xH100-80GB", "--model-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert why in err and "--model-config" in err and "Traceback" not in err


def test_submit_takes_model_config(tmp_path, capsys):
    """submit accepts the flag too and checks the file before anything else (bad input, exit 2)."""
    assert main(["submit", GSM8K, "--dry-run", "--model-config", str(tmp_path / "missing.json")]) == 2
    assert "--model-config" in capsys.readouterr().err
