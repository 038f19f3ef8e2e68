"""Model and GPU catalogs: parameter counts against published sizes, --gpus parsing, config.json reading."""

import json

import pytest

from verl_cluster.errors import ConfigError
from verl_cluster.placement.gpus import parse_gpus
from verl_cluster.placement.model_shape import (catalog, catalog_shape, parse_size, resolve_shape,
                                                shape_from_hf_config)


def _tolerance(published: str) -> float:
    """1%, or half a unit of the last published digit when the card rounds harder than that ("1.7B")."""
    digits = published[:-1]
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    half_unit = 0.5 * 10 ** -decimals / float(digits)
    return max(0.01, half_unit)


@pytest.mark.parametrize("name", sorted(catalog()))
def test_param_count_matches_published_size(name):
    entry = catalog()[name]
    published = parse_size(entry["params_published"])
    computed = catalog_shape(name).params
    assert abs(computed - published) / published <= _tolerance(entry["params_published"])


def test_qwen25_counts_within_one_percent():
    # the published parameter counts of the common shapes
    for name, size in [("qwen2.5-0.5b", 494e6), ("qwen2.5-1.5b", 1.54e9), ("qwen2.5-3b", 3.09e9),
                       ("qwen2.5-7b", 7.62e9), ("llama-3.1-8b", 8.03e9), ("llama-3.1-70b", 70.6e9)]:
        assert abs(catalog_shape(name).params - size) / size < 0.01, name


def test_qwen2_biases_counted():
    s = catalog_shape("qwen2.5-0.5b")
    no_bias = shape_from_hf_config({"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                                    "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                                    "tie_word_embeddings": True, "model_type": "llama"})
    # q bias 896 + k,v bias 2 x 128 per layer
    assert s.params - no_bias.params == 24 * (896 + 2 * 128)


def test_hf_config_matches_catalog(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
           "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    local = resolve_shape(str(tmp_path), None)
    assert local.params == catalog_shape("qwen2.5-1.5b").params


def test_kv_bytes_per_token_hand_computed():
    s = catalog_shape("qwen2.5-7b")  # 28 layers, 4 kv heads, head_dim 128
    assert s.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2
    assert s.kv_bytes_per_token(2, tp=8) == 2 * 28 * 1 * 128 * 2  # kv heads replicated past TP 4


def test_moe_refused_and_unknown_catalog():
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        shape_from_hf_config({"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
                              "intermediate_size": 8, "vocab_size": 8, "num_experts": 8})
    with pytest.raises(ConfigError, match="unknown model") as e:
        catalog_shape("qwen2.5-7c")
    assert "did you mean `qwen2.5-7b`" in e.value.hint
    assert catalog_shape("Qwen/Qwen2.5-7B-Instruct").name == "qwen2.5-7b"


def test_parse_gpus_forms():
    nodes = parse_gpus("2x8xH100-80GB")
    assert len(nodes) == 2 and all(len(n.gpus) == 8 for n in nodes)
    assert nodes[0].gpus[0].compute_capability == "9.0"
    assert nodes[0].p2p_islands() == [list(range(8))]
    rtx = parse_gpus("1x8xRTX4090-24GB")[0]
    assert rtx.p2p_islands() == [[i] for i in range(8)]  # no peer access
    p40 = parse_gpus("1x1xP40-24GB")[0]
    assert p40.gpus[0].sm == (6, 1) and p40.gpus[0].memory_total_mib == 24576
    raw = parse_gpus("1x2x48GB@8.9")[0]
    assert raw.gpus[0].memory_total_mib == 48 * 1024 and raw.gpus[0].compute_capability == "8.9"
    assert len(parse_gpus("8xH100")[0].gpus) == 8
    assert parse_gpus("1x2x80GB@9.0+nvlink")[0].gpu_pairs[0].p2p


@pytest.mark.parametrize("bad", ["", "2x", "x8xH100", "2x8xNOPE", "0x8xH100-80GB", "1x8x12MB@8.0", "axbxc"])
def test_parse_gpus_bad(bad):
    with pytest.raises(ConfigError):
        parse_gpus(bad)
