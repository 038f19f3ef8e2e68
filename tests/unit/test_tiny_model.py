"""The offline model folder: transformers must load it as a Qwen2 model, tokenizer and weights included."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from verl_cluster.testdata.tiny_model import (SHAPES, from_bf16, model_config, read_weights, tensor_shapes, to_bf16,
                                            write_model, write_weights)
from verl_cluster.placement.model_shape import catalog_shape, shape_from_hf_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    write_model(out, "tiny", seed=0)
    return out


def _bf16_bits_by_torch(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_bf16_rounds_like_torch_and_keeps_representable_values():
    exact = np.array([0.0, -0.0, 1.0, -2.5, 0.015625, 3.0e38, 2.0 ** -130, np.inf, -np.inf], np.float32)
    exact = from_bf16(to_bf16(exact))  # make every value representable, then it must survive unchanged
    assert np.array_equal(from_bf16(to_bf16(exact)), exact)
    assert np.array_equal(np.signbit(from_bf16(to_bf16(exact))), np.signbit(exact))
    # ties go to even: 1 + 2^-8 -> 1.0, 1 + 3 * 2^-8 -> 1 + 2^-6
    assert from_bf16(to_bf16(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8], np.float32))).tolist() == [1.0, 1 + 2 ** -6]
    assert np.isnan(from_bf16(to_bf16(np.array([np.nan], np.float32))))[0]
    rand = np.random.default_rng(1).standard_normal(100_000).astype(np.float32) * 10.0
    assert np.array_equal(to_bf16(rand), _bf16_bits_by_torch(rand))


def test_safetensors_round_trip_matches_the_safetensors_library(tmp_path):
    from safetensors.torch import load_file

    config = model_config("tiny", 700, pad_id=697, eos_id=699)
    size = write_weights(tmp_path / "w.safetensors", config, seed=3)
    assert size == (tmp_path / "w.safetensors").stat().st_size
    ours, theirs = read_weights(tmp_path / "w.safetensors"), load_file(tmp_path / "w.safetensors")
    assert [n for n, _ in tensor_shapes(config)] == list(ours) and set(theirs) == set(ours)
    for name, arr in ours.items():
        assert theirs[name].dtype == torch.bfloat16
        assert np.array_equal(theirs[name].float().numpy(), arr), name


def test_init_is_normal_for_matrices_ones_for_norms_zeros_for_biases(tiny):
    w = read_weights(tiny / "model.safetensors")
    assert all((w[n] == 1).all() for n in w if n.endswith("norm.weight"))
    assert all((w[n] == 0).all() for n in w if n.endswith(".bias"))
    emb = w["model.embed_tokens.weight"]
    assert abs(float(emb.std()) - 0.02) < 0.001 and abs(float(emb.mean())) < 0.001
    assert "lm_head.weight" not in w  # tied, as Qwen2.5-0.5B


def test_transformers_loads_every_weight_and_runs_a_forward_pass(tiny):
    model, info = AutoModelForCausalLM.from_pretrained(tiny, output_loading_info=True)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    config = json.loads((tiny / "config.json").read_text())
    state = model.state_dict()
    for name, arr in read_weights(tiny / "model.safetensors").items():
        assert np.array_equal(state[name].float().numpy(), arr), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, config["vocab_size"], (2, 9))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (2, 9, config["vocab_size"])
    assert torch.isfinite(logits.float()).all()


def test_tokenizer_loads_with_chat_template_and_ids_match_the_config(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    config = json.loads((tiny / "config.json").read_text())
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert config["vocab_size"] >= len(tok) and config["vocab_size"] % 64 == 0
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == config["eos_token_id"]
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == config["bos_token_id"] == gen["pad_token_id"]
    assert gen["eos_token_id"] == [tok.eos_token_id, tok.pad_token_id]
    messages = [{"role": "user", "content": "Ava has 12 apples. How many?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nAva has 12 apples. How many?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids  # transformers 5 returns a BatchEncoding
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and max(ids) < len(tok)
    assert tok.decode(ids) == text
    # byte-level: text the corpus never had still encodes and decodes
    assert tok.decode(tok("Ünïcode ✓ 3.14")["input_ids"]) == "Ünïcode ✓ 3.14"


def test_same_seed_same_files_other_seed_other_weights_same_tokenizer(tmp_path, tiny):
    write_model(tmp_path / "again", "tiny", seed=0)
    write_model(tmp_path / "other", "tiny", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tiny / name).read_bytes(), name
    assert (tmp_path / "other" / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    assert (tmp_path / "other" / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()


@pytest.mark.parametrize("shape,params", [("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304),
                                          ("qwen2.5-3b", 3_085_938_688)])
def test_full_shapes_are_qwen2_5_without_writing_them(shape, params):
    config = model_config(shape, 1021, pad_id=1018, eos_id=1020)
    shapes = tensor_shapes(config)
    assert sum(int(np.prod(s)) for _, s in shapes) == params
    assert shape_from_hf_config(config).params == catalog_shape(shape).params == params
    assert (config["vocab_size"], config["max_position_embeddings"], config["rope_theta"]) == (151936, 32768, 1e6)
    assert config["tie_word_embeddings"] and config["rms_norm_eps"] == 1e-6
    # transformers' own module tree (on the meta device: no memory) has exactly these names and shapes
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**config))
    expected = {n: tuple(p.shape) for n, p in model.state_dict().items() if n != "lm_head.weight"}
    assert dict(shapes) == expected


def test_script_writes_the_folder(tmp_path):
    out = tmp_path / "m"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/make_tiny_model.py"), "-o", str(out), "--seed", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tiny: ") and "params" in r.stdout
    assert {p.name for p in out.iterdir()} == {"config.json", "generation_config.json", "model.safetensors",
                                               "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert set(SHAPES) == {"tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"}
